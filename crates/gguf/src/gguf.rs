//! The GGUF container: header, metadata, tensor directory, lazily read tensor bytes.
//!
//! Every count, length and offset in a GGUF file is attacker-controlled, so each is
//! checked against the bytes actually present before anything is allocated or read.
//! A hostile file gets a [`GgufError`], never a panic or an allocation it did not pay for.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use crate::quant::TensorType;

const MAGIC: u32 = 0x4655_4747; // "GGUF" little-endian
const DEFAULT_ALIGNMENT: u64 = 32;
const MAX_DIMS: u32 = 4;
/// Nesting arrays deeper than this is never needed and only useful to an attacker.
const MAX_ARRAY_DEPTH: u32 = 2;

/// What went wrong reading a GGUF file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    #[error("not a GGUF file (magic {0:#010x})")]
    BadMagic(u32),
    #[error("unsupported GGUF version {0} (supported: 2, 3)")]
    UnsupportedVersion(u32),
    #[error("file truncated: needed {needed} bytes at offset {offset}, file has {len}")]
    Truncated { offset: u64, needed: u64, len: u64 },
    #[error("{what} count {count} cannot fit in the {remaining} bytes left")]
    CountTooLarge {
        what: &'static str,
        count: u64,
        remaining: u64,
    },
    #[error("invalid UTF-8 in {0}")]
    InvalidUtf8(&'static str),
    #[error("unknown metadata value type {0}")]
    UnknownValueType(u32),
    #[error("arrays nested deeper than {MAX_ARRAY_DEPTH}")]
    ArrayTooDeep,
    #[error("tensor `{name}` has unknown type id {type_id}")]
    UnknownTensorType { name: String, type_id: u32 },
    #[error("tensor `{name}` has {n_dims} dimensions (max {MAX_DIMS})")]
    TooManyDims { name: String, n_dims: u32 },
    #[error("tensor `{name}` shape {shape:?} is invalid: {why}")]
    BadShape {
        name: String,
        shape: Vec<u64>,
        why: &'static str,
    },
    #[error(
        "tensor `{name}` at offset {offset} (+{size} bytes) lies outside the data section ({data_len} bytes)"
    )]
    TensorOutOfBounds {
        name: String,
        offset: u64,
        size: u64,
        data_len: u64,
    },
    #[error("tensor `{name}` offset {offset} is not aligned to {alignment}")]
    Misaligned {
        name: String,
        offset: u64,
        alignment: u64,
    },
    #[error("duplicate tensor `{0}`")]
    DuplicateTensor(String),
    #[error("alignment {0} is not a power of two")]
    BadAlignment(u64),
    #[error("metadata key `{key}`: {why}")]
    Metadata { key: String, why: String },
    #[error("tensor `{0}` not found")]
    MissingTensor(String),
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}

/// Random-access bytes: a file natively, an `ArrayBuffer` or a chunked fetch in the browser.
pub trait ByteSource {
    /// Total length in bytes.
    fn len(&self) -> u64;
    /// Whether the source holds no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Fills `buf` from `offset`; the caller guarantees `offset + buf.len() <= len()`.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()>;
    /// Bytes `offset..offset + len` lent in place, where the source holds them in memory
    /// (then a tensor is read without a copy), or `None`.
    fn lend(&self, _offset: u64, _len: usize) -> Option<&[u8]> {
        None
    }
}

impl ByteSource for [u8] {
    fn len(&self) -> u64 {
        <[u8]>::len(self) as u64
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let src = self.lend(offset, buf.len()).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "read past end")
        })?;
        buf.copy_from_slice(src);
        Ok(())
    }
    fn lend(&self, offset: u64, len: usize) -> Option<&[u8]> {
        let start = usize::try_from(offset).ok()?;
        self.get(start..start.checked_add(len)?)
    }
}

impl ByteSource for Vec<u8> {
    fn len(&self) -> u64 {
        self.as_slice().len() as u64
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.as_slice().read_at(offset, buf)
    }
    fn lend(&self, offset: u64, len: usize) -> Option<&[u8]> {
        self.as_slice().lend(offset, len)
    }
}

/// A file's first bytes standing for the whole file of `len` bytes: enough to read its
/// header before downloading the rest. Bytes past the prefix read as zeros, so a header
/// that runs past them parses to nonsense, which [`Gguf::read_prefix`] sets aside.
pub struct Prefix {
    bytes: Vec<u8>,
    len: u64,
}

impl ByteSource for Prefix {
    fn len(&self) -> u64 {
        self.len
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        let held = self.bytes.get(start..).unwrap_or_default();
        let n = held.len().min(buf.len());
        buf[..n].copy_from_slice(&held[..n]);
        buf[n..].fill(0);
        Ok(())
    }
}

/// A file read with positioned reads (no shared cursor, so tensors can load in any order).
#[cfg(unix)]
pub struct FileSource {
    file: std::fs::File,
    len: u64,
}

#[cfg(unix)]
impl FileSource {
    /// Opens `path` for reading.
    pub fn open(path: impl AsRef<std::path::Path>) -> std::io::Result<Self> {
        let file = std::fs::File::open(path)?;
        let len = file.metadata()?.len();
        Ok(Self { file, len })
    }
}

#[cfg(unix)]
impl ByteSource for FileSource {
    fn len(&self) -> u64 {
        self.len
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(&self.file, buf, offset)
    }
}

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
}

impl Value {
    /// The value as an unsigned integer, if it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a signed integer, if it is an integer that fits.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// The value as a float, if it is numeric.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    /// The value as a string slice.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The value as an array slice.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The value as a bool.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }
}

/// One entry of the tensor directory.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions in GGUF order: the fastest-varying (input) dimension first.
    pub shape: Vec<u64>,
    pub ty: TensorType,
    /// Offset from the start of the data section.
    pub offset: u64,
    /// Size in bytes.
    pub size: u64,
}

impl TensorInfo {
    /// Number of elements.
    pub fn elements(&self) -> u64 {
        self.shape.iter().product()
    }
}

/// A parsed GGUF header: metadata and tensor directory; tensor bytes stay in the source.
pub struct Gguf<S: ByteSource> {
    pub version: u32,
    pub metadata: BTreeMap<String, Value>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Absolute offset of the data section.
    pub data_offset: u64,
    source: S,
}

impl<S: ByteSource> fmt::Debug for Gguf<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gguf")
            .field("version", &self.version)
            .field("metadata_keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("data_offset", &self.data_offset)
            .finish()
    }
}

/// Buffered, bounds-checked sequential reader over a [`ByteSource`].
struct Reader<'a, S: ByteSource + ?Sized> {
    src: &'a S,
    len: u64,
    pos: u64,
    buf: Vec<u8>,
    buf_start: u64,
}

const READ_WINDOW: usize = 1 << 20;

impl<'a, S: ByteSource + ?Sized> Reader<'a, S> {
    fn new(src: &'a S) -> Self {
        Self {
            src,
            len: src.len(),
            pos: 0,
            buf: Vec::new(),
            buf_start: 0,
        }
    }

    fn remaining(&self) -> u64 {
        self.len - self.pos
    }

    fn ensure(&self, n: u64) -> Result<(), GgufError> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                offset: self.pos,
                needed: n,
                len: self.len,
            });
        }
        Ok(())
    }

    fn bytes(&mut self, n: usize) -> Result<&[u8], GgufError> {
        self.ensure(n as u64)?;
        let buf_end = self.buf_start + self.buf.len() as u64;
        if self.pos < self.buf_start || self.pos + n as u64 > buf_end {
            let want = (n.max(READ_WINDOW) as u64).min(self.len - self.pos) as usize;
            self.buf.resize(want, 0);
            self.src.read_at(self.pos, &mut self.buf)?;
            self.buf_start = self.pos;
        }
        let start = (self.pos - self.buf_start) as usize;
        self.pos += n as u64;
        Ok(&self.buf[start..start + n])
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], GgufError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.bytes(N)?);
        Ok(out)
    }

    fn u32(&mut self) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn string(&mut self, what: &'static str) -> Result<String, GgufError> {
        let len = self.u64()?;
        if len > self.remaining() {
            return Err(GgufError::CountTooLarge {
                what,
                count: len,
                remaining: self.remaining(),
            });
        }
        let bytes = self.bytes(len as usize)?.to_vec();
        String::from_utf8(bytes).map_err(|_| GgufError::InvalidUtf8(what))
    }

    fn value(&mut self, ty: u32, depth: u32) -> Result<Value, GgufError> {
        Ok(match ty {
            0 => Value::U8(self.array::<1>()?[0]),
            1 => Value::I8(self.array::<1>()?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.array()?)),
            3 => Value::I16(i16::from_le_bytes(self.array()?)),
            4 => Value::U32(self.u32()?),
            5 => Value::I32(i32::from_le_bytes(self.array()?)),
            6 => Value::F32(f32::from_le_bytes(self.array()?)),
            7 => Value::Bool(self.array::<1>()?[0] != 0),
            8 => Value::String(self.string("string value")?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(GgufError::ArrayTooDeep);
                }
                let elem_ty = self.u32()?;
                let count = self.u64()?;
                let min_size =
                    min_value_size(elem_ty).ok_or(GgufError::UnknownValueType(elem_ty))?;
                if count.saturating_mul(min_size) > self.remaining() {
                    return Err(GgufError::CountTooLarge {
                        what: "array",
                        count,
                        remaining: self.remaining(),
                    });
                }
                let mut items = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    items.push(self.value(elem_ty, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(self.u64()?),
            11 => Value::I64(i64::from_le_bytes(self.array()?)),
            12 => Value::F64(f64::from_le_bytes(self.array()?)),
            other => return Err(GgufError::UnknownValueType(other)),
        })
    }
}

/// The fewest bytes one value of this type occupies (a string is at least its length).
fn min_value_size(ty: u32) -> Option<u64> {
    Some(match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 => 8,
        9 => 12,
        10..=12 => 8,
        _ => return None,
    })
}

/// Fewest bytes a metadata entry occupies: key length (8), a key byte, type (4), a value byte.
const MIN_METADATA_ENTRY_BYTES: u64 = 13;

/// Fewest bytes a tensor info occupies: name length (8), n_dims (4), type (4), offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 24;

/// The fixed-size fields that open a GGUF file.
struct Header {
    version: u32,
    tensor_count: u64,
    kv_count: u64,
}

/// The sections of a GGUF header, each parsed in file order.
impl<S: ByteSource + ?Sized> Reader<'_, S> {
    /// Rejects a hostile count before anything is allocated for it.
    fn check_count(&self, what: &'static str, count: u64, min_size: u64) -> Result<(), GgufError> {
        if count.saturating_mul(min_size) > self.remaining() {
            return Err(GgufError::CountTooLarge {
                what,
                count,
                remaining: self.remaining(),
            });
        }
        Ok(())
    }

    /// Fails early on files that are not GGUF, or a version whose layout this reader lacks.
    fn header(&mut self) -> Result<Header, GgufError> {
        let magic = self.u32()?;
        if magic != MAGIC {
            return Err(GgufError::BadMagic(magic));
        }
        let version = self.u32()?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::UnsupportedVersion(version));
        }
        let tensor_count = self.u64()?;
        let kv_count = self.u64()?;
        Ok(Header {
            version,
            tensor_count,
            kv_count,
        })
    }

    /// Key-value metadata; a later duplicate key wins, as it always has.
    fn metadata(&mut self, kv_count: u64) -> Result<BTreeMap<String, Value>, GgufError> {
        self.check_count("metadata", kv_count, MIN_METADATA_ENTRY_BYTES)?;
        let mut metadata = BTreeMap::new();
        for _ in 0..kv_count {
            let key = self.string("metadata key")?;
            let ty = self.u32()?;
            let value = self.value(ty, 0)?;
            metadata.insert(key, value);
        }
        Ok(metadata)
    }

    /// The tensor directory; `tensor_count` must have passed [`Reader::check_count`] first.
    fn tensor_infos(&mut self, tensor_count: u64) -> Result<Vec<TensorInfo>, GgufError> {
        let mut tensors = Vec::with_capacity(tensor_count as usize);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..tensor_count {
            let info = self.tensor_info()?;
            if !seen.insert(info.name.clone()) {
                return Err(GgufError::DuplicateTensor(info.name));
            }
            tensors.push(info);
        }
        Ok(tensors)
    }

    /// One directory entry, its rank capped before the shape is allocated.
    fn tensor_info(&mut self) -> Result<TensorInfo, GgufError> {
        let name = self.string("tensor name")?;
        let n_dims = self.u32()?;
        if n_dims > MAX_DIMS {
            return Err(GgufError::TooManyDims { name, n_dims });
        }
        let mut shape = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            shape.push(self.u64()?);
        }
        let type_id = self.u32()?;
        let offset = self.u64()?;
        let ty = TensorType::from_id(type_id).ok_or_else(|| GgufError::UnknownTensorType {
            name: name.clone(),
            type_id,
        })?;
        let size = tensor_size(&name, &shape, ty)?;
        Ok(TensorInfo {
            name,
            shape,
            ty,
            offset,
            size,
        })
    }
}

/// The alignment of the data section: offsets and the section's start depend on it.
fn data_alignment(metadata: &BTreeMap<String, Value>) -> Result<u64, GgufError> {
    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => v.as_u64().ok_or_else(|| GgufError::Metadata {
            key: "general.alignment".into(),
            why: "not an unsigned integer".into(),
        })?,
    };
    if alignment == 0 || !alignment.is_power_of_two() {
        return Err(GgufError::BadAlignment(alignment));
    }
    Ok(alignment)
}

/// Keeps every later read of a tensor's bytes aligned and inside the file.
fn check_placement(tensors: &[TensorInfo], alignment: u64, data_len: u64) -> Result<(), GgufError> {
    for t in tensors {
        if !t.offset.is_multiple_of(alignment) {
            return Err(GgufError::Misaligned {
                name: t.name.clone(),
                offset: t.offset,
                alignment,
            });
        }
        if t.offset
            .checked_add(t.size)
            .is_none_or(|end| end > data_len)
        {
            return Err(GgufError::TensorOutOfBounds {
                name: t.name.clone(),
                offset: t.offset,
                size: t.size,
                data_len,
            });
        }
    }
    Ok(())
}

impl Gguf<Prefix> {
    /// The header of a file of `file_len` bytes read from its first bytes, before the rest
    /// is downloaded; `Ok(None)` when the header runs past them (ask for more). A file that
    /// is not a GGUF at all is refused at once.
    pub fn read_prefix(bytes: Vec<u8>, file_len: u64) -> Result<Option<Self>, GgufError> {
        let have = bytes.len() as u64;
        let whole = have >= file_len;
        let prefix = Prefix {
            bytes,
            len: file_len.max(have),
        };
        match Gguf::read(prefix) {
            // The reader went no further than the data section's start: every byte it read
            // was the file's.
            Ok(g) if whole || g.data_offset <= have => Ok(Some(g)),
            Err(e @ (GgufError::BadMagic(_) | GgufError::UnsupportedVersion(_))) => Err(e),
            Err(e) if whole => Err(e),
            _ => Ok(None),
        }
    }
}

impl<S: ByteSource> Gguf<S> {
    /// Parses the header of `source`; tensor bytes are read later, on demand.
    pub fn read(source: S) -> Result<Self, GgufError> {
        let mut r = Reader::new(&source);
        let header = r.header()?;
        let metadata = r.metadata(header.kv_count)?;
        // Checked before the alignment so a hostile count is the error reported first.
        r.check_count("tensor", header.tensor_count, MIN_TENSOR_INFO_BYTES)?;
        let alignment = data_alignment(&metadata)?;
        let tensors = r.tensor_infos(header.tensor_count)?;
        let data_offset = r.pos.div_ceil(alignment).saturating_mul(alignment);
        let data_len = source.len().saturating_sub(data_offset);
        check_placement(&tensors, alignment, data_len)?;
        Ok(Self {
            version: header.version,
            metadata,
            tensors,
            alignment,
            data_offset,
            source,
        })
    }

    /// The tensor directory entry called `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The raw (still quantized) bytes of tensor `name`: lent in place where the source
    /// holds the file in memory (the page's model buffer), else read into a copy.
    pub fn tensor_bytes(&self, name: &str) -> Result<Cow<'_, [u8]>, GgufError> {
        let info = self
            .tensor(name)
            .ok_or_else(|| GgufError::MissingTensor(name.into()))?;
        let offset = self.data_offset + info.offset;
        if let Some(lent) = self.source.lend(offset, info.size as usize) {
            return Ok(Cow::Borrowed(lent));
        }
        let mut buf = vec![0u8; info.size as usize];
        self.source.read_at(offset, &mut buf)?;
        Ok(Cow::Owned(buf))
    }

    /// A metadata value by key.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    /// A required string value.
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        self.get(key)
            .and_then(Value::as_str)
            .ok_or_else(|| missing(key, "string"))
    }

    /// A required unsigned integer value.
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        self.get(key)
            .and_then(Value::as_u64)
            .ok_or_else(|| missing(key, "unsigned integer"))
    }

    /// A required float value.
    pub fn get_f64(&self, key: &str) -> Result<f64, GgufError> {
        self.get(key)
            .and_then(Value::as_f64)
            .ok_or_else(|| missing(key, "number"))
    }

    /// A required array of strings.
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        let arr = self
            .get(key)
            .and_then(Value::as_array)
            .ok_or_else(|| missing(key, "array"))?;
        arr.iter()
            .map(|v| v.as_str().ok_or_else(|| missing(key, "array of strings")))
            .collect()
    }

    /// The underlying byte source.
    pub fn source(&self) -> &S {
        &self.source
    }
}

fn missing(key: &str, ty: &str) -> GgufError {
    GgufError::Metadata {
        key: key.into(),
        why: format!("missing or not a {ty}"),
    }
}

fn tensor_size(name: &str, shape: &[u64], ty: TensorType) -> Result<u64, GgufError> {
    let bad = |why| GgufError::BadShape {
        name: name.into(),
        shape: shape.to_vec(),
        why,
    };
    if shape.contains(&0) {
        return Err(bad("zero-sized dimension"));
    }
    let elements = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| bad("element count overflows"))?;
    let block = ty.block_elements();
    if shape.first().is_some_and(|&d| !d.is_multiple_of(block)) {
        return Err(bad("first dimension is not a multiple of the block size"));
    }
    (elements / block)
        .checked_mul(ty.block_bytes())
        .ok_or_else(|| bad("byte size overflows"))
}

/// Writes GGUF files; used by tests to build tiny models and hostile inputs.
#[derive(Debug, Default)]
pub struct GgufWriter {
    kvs: Vec<(String, Value)>,
    tensors: Vec<(String, Vec<u64>, TensorType, Vec<u8>)>,
    version: u32,
}

impl GgufWriter {
    /// A writer for a version-3 file.
    pub fn new() -> Self {
        Self {
            version: 3,
            ..Default::default()
        }
    }

    /// Sets the GGUF version written (2 or 3).
    pub fn version(mut self, version: u32) -> Self {
        self.version = version;
        self
    }

    /// Adds a metadata entry.
    pub fn kv(mut self, key: &str, value: Value) -> Self {
        self.kvs.push((key.into(), value));
        self
    }

    /// Adds a tensor with raw bytes in `ty`'s block format.
    pub fn tensor(mut self, name: &str, shape: &[u64], ty: TensorType, bytes: Vec<u8>) -> Self {
        self.tensors.push((name.into(), shape.to_vec(), ty, bytes));
        self
    }

    /// Serialises the file.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC.to_le_bytes());
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.kvs.len() as u64).to_le_bytes());
        for (k, v) in &self.kvs {
            write_str(&mut out, k);
            out.extend_from_slice(&value_type(v).to_le_bytes());
            write_value(&mut out, v);
        }
        let mut offset = 0u64;
        let mut offsets = Vec::new();
        for (name, shape, ty, bytes) in &self.tensors {
            write_str(&mut out, name);
            out.extend_from_slice(&(shape.len() as u32).to_le_bytes());
            for d in shape {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&ty.id().to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offsets.push(offset);
            offset = (offset + bytes.len() as u64).div_ceil(DEFAULT_ALIGNMENT) * DEFAULT_ALIGNMENT;
        }
        out.resize(
            out.len().div_ceil(DEFAULT_ALIGNMENT as usize) * DEFAULT_ALIGNMENT as usize,
            0,
        );
        let data_start = out.len();
        for ((_, _, _, bytes), off) in self.tensors.iter().zip(offsets) {
            out.resize(data_start + off as usize, 0);
            out.extend_from_slice(bytes);
        }
        out
    }
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn value_type(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn write_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => write_str(out, s),
        Value::Array(items) => {
            let elem = items.first().map_or(4, value_type);
            out.extend_from_slice(&elem.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                write_value(out, item);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        GgufWriter::new()
            .kv("general.architecture", Value::String("llama".into()))
            .kv("llama.block_count", Value::U32(2))
            .kv(
                "tokenizer.ggml.tokens",
                Value::Array(vec![Value::String("a".into()), Value::String("é".into())]),
            )
            .kv("x.f64", Value::F64(1.5))
            .kv("x.bool", Value::Bool(true))
            .tensor("w", &[32, 2], TensorType::F32, vec![7u8; 256])
            .tensor("q", &[32, 1], TensorType::Q8_0, vec![1u8; 34])
            .to_bytes()
    }

    #[test]
    fn reads_metadata_and_tensors_of_v2_and_v3() {
        for version in [2, 3] {
            let mut bytes = sample();
            bytes[4..8].copy_from_slice(&u32::to_le_bytes(version));
            let g = Gguf::read(bytes).expect("valid file");
            assert_eq!(g.version, version);
            assert_eq!(g.get_str("general.architecture").expect("arch"), "llama");
            assert_eq!(g.get_u64("llama.block_count").expect("blocks"), 2);
            assert_eq!(
                g.get_str_array("tokenizer.ggml.tokens").expect("tokens"),
                vec!["a", "é"]
            );
            assert_eq!(g.get("x.bool").and_then(Value::as_bool), Some(true));
            assert_eq!(g.get_f64("x.f64").expect("f64"), 1.5);
            assert_eq!(g.tensor_bytes("w").expect("w"), vec![7u8; 256]);
            assert_eq!(g.tensor_bytes("q").expect("q"), vec![1u8; 34]);
            // A file held in memory lends its tensors' bytes instead of copying them.
            assert!(matches!(g.tensor_bytes("q"), Ok(Cow::Borrowed(_))));
            assert_eq!(g.tensor("q").map(|t| t.elements()), Some(32));
        }
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let bytes = sample();
        for cut in 0..bytes.len() - 1 {
            assert!(
                Gguf::read(bytes[..cut].to_vec()).is_err(),
                "cut at {cut} parsed"
            );
        }
    }

    #[test]
    fn a_header_is_read_from_the_first_bytes_once_they_hold_it() {
        let bytes = sample();
        let whole = Gguf::read(bytes.clone()).expect("valid file");
        let len = bytes.len() as u64;
        for cut in 8..bytes.len() {
            let read = Gguf::read_prefix(bytes[..cut].to_vec(), len).expect("not refused");
            match read {
                None => assert!(
                    (cut as u64) < whole.data_offset,
                    "cut at {cut} asked for more"
                ),
                Some(g) => {
                    assert!(
                        cut as u64 >= whole.data_offset,
                        "cut at {cut} read past its bytes"
                    );
                    assert_eq!((&g.metadata, &g.tensors), (&whole.metadata, &whole.tensors));
                }
            }
        }
        let mut not_gguf = bytes[..64].to_vec();
        not_gguf[0] = b'X';
        assert!(matches!(
            Gguf::read_prefix(not_gguf, len),
            Err(GgufError::BadMagic(_))
        ));
        assert!(
            Gguf::read_prefix(bytes[..40].to_vec(), 40).is_err(),
            "a whole file that is cut"
        );
    }

    #[test]
    fn huge_counts_are_refused_before_allocating() {
        let mut bytes = sample();
        bytes[16..24].copy_from_slice(&u64::MAX.to_le_bytes()); // metadata count
        assert!(matches!(
            Gguf::read(bytes),
            Err(GgufError::CountTooLarge { .. })
        ));
        // A string length of 2^62 in the first key.
        let mut bytes = sample();
        bytes[24..32].copy_from_slice(&(1u64 << 62).to_le_bytes());
        assert!(matches!(
            Gguf::read(bytes),
            Err(GgufError::CountTooLarge { .. })
        ));
    }

    #[test]
    fn unknown_tensor_type_is_named() {
        let bytes = sample();
        // The first tensor's type id sits right after its name, n_dims and two dims.
        let name_pos = bytes
            .windows(9)
            .position(|w| w == b"\x01\0\0\0\0\0\0\0w")
            .expect("tensor name")
            + 9;
        let type_pos = name_pos + 4 + 16;
        let mut bad = bytes.clone();
        bad[type_pos..type_pos + 4].copy_from_slice(&99u32.to_le_bytes());
        let err = Gguf::read(bad).unwrap_err();
        assert!(
            matches!(&err, GgufError::UnknownTensorType { name, type_id: 99 } if name == "w"),
            "{err}"
        );
    }

    #[test]
    fn tensor_outside_the_file_is_refused() {
        let mut bytes = sample();
        bytes.truncate(bytes.len() - 40);
        assert!(matches!(
            Gguf::read(bytes),
            Err(GgufError::TensorOutOfBounds { .. })
        ));
    }

    #[test]
    fn bad_magic_and_version() {
        assert!(matches!(
            Gguf::read(b"GGML\x03\0\0\0".to_vec()),
            Err(GgufError::BadMagic(_))
        ));
        let mut bytes = sample();
        bytes[4..8].copy_from_slice(&1u32.to_le_bytes());
        assert!(matches!(
            Gguf::read(bytes),
            Err(GgufError::UnsupportedVersion(1))
        ));
    }
}

#[cfg(test)]
mod mutation {
    //! A deterministic mutation fuzzer over a valid file: whatever the bytes, reading returns
    //! (never panics, never allocates past the file). A stand-in for `cargo fuzz`, which needs
    //! a nightly toolchain these machines cannot fetch.
    use super::*;

    #[test]
    fn mutated_headers_never_panic() {
        let base = GgufWriter::new()
            .kv("general.architecture", Value::String("llama".into()))
            .kv("a", Value::Array(vec![Value::U32(1), Value::U32(2)]))
            .kv("s", Value::Array(vec![Value::String("x".into())]))
            .tensor("w", &[32, 2], TensorType::Q8_0, vec![3u8; 68])
            .tensor("v", &[4], TensorType::F32, vec![0u8; 16])
            .to_bytes();
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..50_000 {
            let mut bytes = base.clone();
            for _ in 0..(1 + next() % 4) {
                let pos = (next() as usize) % bytes.len();
                match next() % 4 {
                    0 => bytes[pos] = next() as u8,
                    1 => bytes[pos] = 0xFF,
                    2 => bytes.truncate(pos),
                    _ => {
                        let end = (pos + 8).min(bytes.len());
                        bytes[pos..end].iter_mut().for_each(|b| *b = 0xFF);
                    }
                }
                if bytes.is_empty() {
                    break;
                }
            }
            if let Ok(g) = Gguf::read(bytes) {
                for t in g.tensors.clone() {
                    let _ = g.tensor_bytes(&t.name);
                }
            }
        }
    }
}
