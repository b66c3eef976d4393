//! File I/O around the core: map the input, write the output pieces to a new
//! temporary file (copying unchanged ranges in the kernel), and self-check the
//! written bytes. Renaming into place is the caller's decision.

use hugify_core::output::Chunk;
use hugify_core::{Error, Options, Reason, Transformed};
use memmap2::Mmap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;

/// Why a file operation failed: the core refused, or the system did.
pub enum Failure {
    /// The core's verdict.
    Core(Error),
    /// An I/O error, with the path it concerns.
    Io(String, io::Error),
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure::Core(e)
    }
}

fn io_err(path: &Path) -> impl Fn(io::Error) -> Failure + '_ {
    move |e| Failure::Io(path.display().to_string(), e)
}

/// Maps a file read-only. Empty files cannot be mapped; they are not ELF either.
pub fn map(path: &Path) -> Result<(File, Option<Mmap>), Failure> {
    let f = File::open(path).map_err(io_err(path))?;
    let len = f.metadata().map_err(io_err(path))?.len();
    if len == 0 {
        return Ok((f, None));
    }
    // SAFETY: the mapping is read-only and private to this call; a concurrent
    // writer could change the bytes under us, which the self-check would catch.
    let m = unsafe { Mmap::map(&f) }.map_err(io_err(path))?;
    Ok((f, Some(m)))
}

/// Transforms `src` into the new file `tmp` (which must not exist), then verifies it.
/// On any failure `tmp` is removed.
pub fn transform_file(src: &Path, tmp: &Path, opts: &Options) -> Result<Transformed, Failure> {
    let (file, m) = map(src)?;
    let input: &[u8] = m.as_deref().unwrap_or(&[]);
    let mut t = hugify_core::transform(input, opts)?;
    // Planning read much of the input; writing copies most of it in the kernel and
    // re-reads only edited blocks, so the pages planning touched can go now.
    release(m.as_ref());
    let out = OpenOptions::new().write(true).read(true).create_new(true).mode(0o600).open(tmp).map_err(io_err(tmp))?;
    let result = write_pieces(&t, &file, input, m.as_ref(), &out).map_err(io_err(tmp)).and_then(|()| {
        // SAFETY: we created this file and nobody else writes it.
        let written = unsafe { Mmap::map(&out) }.map_err(io_err(tmp))?;
        hugify_core::verify(input, &written, &mut t).map_err(Failure::Core)
    });
    if let Err(e) = result {
        let _ = std::fs::remove_file(tmp);
        return Err(e);
    }
    Ok(t)
}

fn write_pieces(t: &Transformed, src: &File, input: &[u8], map: Option<&Mmap>, out: &File) -> io::Result<()> {
    out.set_len(t.output.size)?;
    let mut since_release = 0usize;
    t.output.for_each_chunk(input, |c| match c {
        Chunk::Copy { src: from, dst, len } => copy_range(src, from, out, dst, len, input),
        Chunk::Bytes { dst, data } => {
            out.write_all_at(data, dst)?;
            // Edited blocks read the input through the mapping: let those pages go
            // every few MiB so that writing never holds the whole input.
            since_release += data.len();
            if since_release >= 8 << 20 {
                release(map);
                since_release = 0;
            }
            Ok(())
        }
    })
}

/// Drops the mapped input pages from this process (the page cache keeps them).
fn release(map: Option<&Mmap>) {
    if let Some(m) = map {
        // SAFETY: the mapping is a read-only view of a file; MADV_DONTNEED only drops
        // page-table entries, and later reads fault the same bytes back in.
        let _ = unsafe { m.unchecked_advise(memmap2::UncheckedAdvice::DontNeed) };
    }
}

/// Copies `len` bytes in the kernel; falls back to a plain write where the file
/// system cannot (EXDEV, EINVAL, ENOSYS, EOPNOTSUPP).
fn copy_range(src: &File, mut from: u64, out: &File, mut to: u64, mut len: u64, input: &[u8]) -> io::Result<()> {
    while len > 0 {
        let mut off_in = from as libc::loff_t;
        let mut off_out = to as libc::loff_t;
        // SAFETY: both descriptors are open files; offsets are passed by pointer.
        let n = unsafe {
            libc::copy_file_range(src.as_raw_fd(), &mut off_in, out.as_raw_fd(), &mut off_out, len as usize, 0)
        };
        if n <= 0 {
            let err = io::Error::last_os_error();
            let fallback = n == 0
                || matches!(err.raw_os_error(), Some(libc::EXDEV | libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP));
            if !fallback {
                return Err(err);
            }
            return out.write_all_at(&input[from as usize..(from + len) as usize], to);
        }
        let n = n as u64;
        from += n;
        to += n;
        len -= n;
    }
    Ok(())
}

/// An internal error made from a caught panic.
pub fn panic_error(payload: Box<dyn std::any::Any + Send>) -> Error {
    let msg = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into());
    Error::new(Reason::Internal, format!("panic in the rewriter: {msg}"))
}
