//! File I/O around the core: map the input, write the output pieces into a new
//! file the caller created (copying unchanged ranges in the kernel), and self-check
//! the written bytes. The caller opens both files and renames the output into
//! place (hugify/files.py): this module never opens a file to write by name, so no
//! path another user could swap is used here.

use hugify_core::output::Chunk;
use hugify_core::{Error, Options, Reason, Transformed};
use memmap2::Mmap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::os::unix::io::{AsRawFd, FromRawFd, RawFd};
use std::path::PathBuf;

/// Why a file operation failed: the core refused, or the system did.
pub enum Failure {
    /// The core's verdict.
    Core(Error),
    /// An I/O error, with the file it concerns.
    Io(String, io::Error),
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure::Core(e)
    }
}

fn io_err(label: &str) -> impl Fn(io::Error) -> Failure + '_ {
    move |e| Failure::Io(label.to_string(), e)
}

/// A file to read: a descriptor the caller opened (and keeps), or a path.
pub enum Input {
    Fd(RawFd, String),
    Path(PathBuf),
}

impl Input {
    fn label(&self) -> String {
        match self {
            Input::Fd(_, label) => label.clone(),
            Input::Path(p) => p.display().to_string(),
        }
    }

    /// An open file of our own: a duplicate of the caller's descriptor, or the path
    /// opened without blocking (a FIFO would wait for a writer forever).
    fn open(&self) -> Result<File, Failure> {
        match self {
            Input::Fd(fd, label) => dup(*fd, label),
            Input::Path(p) => {
                OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(p).map_err(io_err(&self.label()))
            }
        }
    }
}

/// Our own descriptor for the caller's: the caller closes theirs whenever it likes.
fn dup(fd: RawFd, label: &str) -> Result<File, Failure> {
    // SAFETY: fcntl only reads the descriptor number; a closed one fails with EBADF.
    let new = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if new < 0 {
        return Err(Failure::Io(label.to_string(), io::Error::last_os_error()));
    }
    // SAFETY: `new` was just made for this process and nothing else owns it.
    Ok(unsafe { File::from_raw_fd(new) })
}

/// Opens and maps a file read-only. Empty files cannot be mapped; they are not ELF
/// either. Anything but a regular file is refused before a byte is read.
pub fn map(input: &Input) -> Result<(File, Option<Mmap>), Failure> {
    let label = input.label();
    let f = input.open()?;
    let meta = f.metadata().map_err(io_err(&label))?;
    if !meta.is_file() {
        let t = meta.file_type();
        let what = if t.is_fifo() {
            "a FIFO"
        } else if t.is_char_device() {
            "a character device"
        } else if t.is_block_device() {
            "a block device"
        } else if t.is_socket() {
            "a socket"
        } else if t.is_dir() {
            "a directory"
        } else {
            "not a regular file"
        };
        // The caller names the file: the detail says only what it is.
        return Err(Failure::Core(Error::new(Reason::NotRegular, format!("{what}, not a regular file"))));
    }
    if meta.len() == 0 {
        return Ok((f, None));
    }
    // SAFETY: the mapping is read-only and private to this call; a concurrent
    // writer could change the bytes under us, which the self-check would catch.
    let m = unsafe { Mmap::map(&f) }.map_err(io_err(&label))?;
    Ok((f, Some(m)))
}

/// Transforms `src` into `out`, a new empty file the caller created for reading and
/// writing, then verifies what was written. Neither is closed, renamed or removed
/// here: on failure the caller discards `out`.
pub fn transform_fd(src: &Input, out: RawFd, out_label: &str, opts: &Options) -> Result<Transformed, Failure> {
    let (file, m) = map(src)?;
    let input: &[u8] = m.as_deref().unwrap_or(&[]);
    let mut t = hugify_core::transform(input, opts)?;
    // Planning read much of the input; writing copies most of it in the kernel and
    // re-reads only edited blocks, so the pages planning touched can go now.
    release(m.as_ref());
    let out = dup(out, out_label)?;
    write_pieces(&t, &file, input, m.as_ref(), &out).map_err(io_err(out_label))?;
    // SAFETY: the caller created this file for us and nobody else writes it.
    let written = unsafe { Mmap::map(&out) }.map_err(io_err(out_label))?;
    hugify_core::verify(input, &written, &mut t)?;
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
