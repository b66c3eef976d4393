//! Little-endian byte strings for the unit tests of the DWARF and call-frame walkers,
//! written field by field. Every writer returns the offset it wrote at, so a test
//! names the place an edit must land by the field it put there, not by counting; and
//! `repaired`, one section put through a walker under the tests' shared map.

/// A growing byte string.
#[derive(Default)]
pub(crate) struct Bytes(pub Vec<u8>);

impl Bytes {
    pub fn new() -> Self {
        Bytes::default()
    }
    /// The offset the next field goes to.
    pub fn at(&self) -> u64 {
        self.0.len() as u64
    }
    pub fn raw(&mut self, b: &[u8]) -> u64 {
        let at = self.at();
        self.0.extend_from_slice(b);
        at
    }
    pub fn u8(&mut self, v: u8) -> u64 {
        self.raw(&[v])
    }
    pub fn u16(&mut self, v: u16) -> u64 {
        self.raw(&v.to_le_bytes())
    }
    pub fn u32(&mut self, v: u32) -> u64 {
        self.raw(&v.to_le_bytes())
    }
    pub fn u64(&mut self, v: u64) -> u64 {
        self.raw(&v.to_le_bytes())
    }
    /// An address (or any word) of `size` bytes.
    pub fn word(&mut self, v: u64, size: u8) -> u64 {
        self.raw(&v.to_le_bytes()[..usize::from(size)])
    }
    pub fn uleb(&mut self, v: u64) -> u64 {
        self.raw(&uleb(v, 0))
    }
    /// A ULEB128 padded with continuation bytes to `len` bytes, as linkers that
    /// reserve room for relaxation write them.
    pub fn uleb_padded(&mut self, v: u64, len: usize) -> u64 {
        self.raw(&uleb(v, len))
    }
    pub fn sleb(&mut self, mut v: i64) -> u64 {
        let at = self.at();
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            let done = (v == 0 && byte & 0x40 == 0) || (v == -1 && byte & 0x40 != 0);
            self.0.push(if done { byte } else { byte | 0x80 });
            if done {
                return at;
            }
        }
    }
    /// A NUL-terminated string.
    pub fn str(&mut self, s: &str) -> u64 {
        let at = self.raw(s.as_bytes());
        self.u8(0);
        at
    }
    /// A 32-bit DWARF initial length, to be filled in by `end_length`.
    pub fn length(&mut self) -> u64 {
        self.u32(0)
    }
    /// Fills the length field at `field` with the number of bytes after it.
    pub fn end_length(&mut self, field: u64) {
        let n = (self.at() - field - 4) as u32;
        self.0[field as usize..field as usize + 4].copy_from_slice(&n.to_le_bytes());
    }
}

/// A unit, list table or line program: the header `header` writes (returning its
/// length field), then `body`, the length filled in.
pub(crate) fn framed(header: impl FnOnce(&mut Bytes) -> u64, body: impl FnOnce(&mut Bytes)) -> Vec<u8> {
    let mut b = Bytes::new();
    let len = header(&mut b);
    body(&mut b);
    b.end_length(len);
    b.0
}

/// A list entry: its kind, then ULEB128 operands.
pub(crate) fn entry(b: &mut Bytes, kind: u8, ulebs: &[u64]) -> u64 {
    let at = b.u8(kind);
    for &v in ulebs {
        b.uleb(v);
    }
    at
}

/// Asserts that `walk` refuses each input with the reason beside it.
pub(crate) fn assert_refused<T>(
    cases: &[(Vec<u8>, crate::error::Reason)],
    walk: impl Fn(&[u8]) -> crate::error::Result<T>,
) {
    for (i, (data, reason)) in cases.iter().enumerate() {
        match walk(data) {
            Ok(_) => panic!("case {i} was accepted"),
            Err(e) => assert_eq!(e.reason, *reason, "case {i}: {}", e.detail),
        }
    }
}

/// The ULEB128 encoding of `v`, padded to at least `len` bytes.
pub(crate) fn uleb(mut v: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 && out.len() + 1 >= len {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

/// `data` with each (offset, value, size) field overwritten: what a test expects a
/// section to read after the walk, every other byte unchanged.
pub(crate) fn patched(data: &[u8], fields: &[(u64, u64, u8)]) -> Vec<u8> {
    let mut out = data.to_vec();
    for &(at, v, size) in fields {
        out[at as usize..at as usize + usize::from(size)].copy_from_slice(&v.to_le_bytes()[..usize::from(size)]);
    }
    out
}

/// The map the walkers' tests share: 0x1000..=0x8fff moves up by 2 MiB.
pub(crate) const MAP: crate::addr_map::AddrMap = crate::addr_map::AddrMap::shift(0x1000, 0x8fff, DV);
/// Its displacement.
pub(crate) const DV: u64 = 0x20_0000;

/// A section `name` holding `data`, put through one walker's `repair` under [`MAP`]:
/// the section's bytes with the edits applied.
pub(crate) fn repaired(
    name: &str,
    data: &[u8],
    repair: impl FnOnce(&super::Sections, &mut super::Edits) -> crate::error::Result<()>,
) -> crate::error::Result<Vec<u8>> {
    let secs = super::Sections::for_tests(&[(name, data)]);
    let mut ed = super::Edits::new(&secs);
    repair(&secs, &mut ed)?;
    Ok(ed.applied(&secs, super::SecId(0), &MAP))
}

/// A DWARF 32-bit encoding.
pub(crate) fn encoding(version: u16, address_size: u8) -> gimli::Encoding {
    gimli::Encoding { format: gimli::Format::Dwarf32, version, address_size }
}

/// One abbreviation: code, tag, whether it has children, (attribute, form) pairs.
pub(crate) fn abbrev(
    b: &mut Bytes,
    code: u64,
    tag: gimli::DwTag,
    children: bool,
    attrs: &[(gimli::DwAt, gimli::DwForm)],
) {
    b.uleb(code);
    b.uleb(u64::from(tag.0));
    b.u8(if children { gimli::DW_CHILDREN_yes.0 } else { gimli::DW_CHILDREN_no.0 });
    for (at, form) in attrs {
        b.uleb(u64::from(at.0));
        b.uleb(u64::from(form.0));
    }
    b.uleb(0);
    b.uleb(0);
}
