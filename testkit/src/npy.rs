//! NumPy `.npy` files (format version 1.0), for exchanging tensors with a PyTorch
//! reference: little-endian `f4` and `i4`, C order. Small on purpose: it writes what numpy
//! reads and reads what it writes for these two types, and refuses anything else with an
//! error that says what it expected and what it found.

use std::fmt;
use std::io::{self, Read, Write};
use std::path::Path;

const MAGIC: &[u8] = b"\x93NUMPY";

/// An element type this module reads and writes.
pub trait Element: Copy + Default + fmt::Debug {
    /// The numpy `descr`.
    const DESCR: &'static str;
    /// Little-endian bytes.
    fn to_le(self) -> [u8; 4];
    /// From little-endian bytes.
    fn from_le(b: [u8; 4]) -> Self;
}

impl Element for f32 {
    const DESCR: &'static str = "<f4";
    fn to_le(self) -> [u8; 4] {
        self.to_le_bytes()
    }
    fn from_le(b: [u8; 4]) -> Self {
        f32::from_le_bytes(b)
    }
}

impl Element for i32 {
    const DESCR: &'static str = "<i4";
    fn to_le(self) -> [u8; 4] {
        self.to_le_bytes()
    }
    fn from_le(b: [u8; 4]) -> Self {
        i32::from_le_bytes(b)
    }
}

/// A tensor read from or written to a `.npy` file.
#[derive(Clone, Debug, PartialEq)]
pub struct Array<T> {
    /// The shape, outermost first.
    pub shape: Vec<usize>,
    /// The elements in C order.
    pub data: Vec<T>,
}

/// What went wrong reading or writing a `.npy` file.
#[derive(Debug)]
pub enum NpyError {
    /// The file could not be read or written.
    Io(io::Error),
    /// The file is not what this module reads.
    Format(String),
}

impl fmt::Display for NpyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NpyError::Io(e) => write!(f, "{e}"),
            NpyError::Format(m) => write!(f, "{m}"),
        }
    }
}

impl std::error::Error for NpyError {}

impl From<io::Error> for NpyError {
    fn from(e: io::Error) -> Self {
        NpyError::Io(e)
    }
}

fn header<T: Element>(shape: &[usize]) -> Vec<u8> {
    let dims = match shape {
        [] => String::new(),
        [n] => format!("{n},"),
        _ => shape
            .iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(", "),
    };
    let mut dict = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': ({dims}), }}",
        T::DESCR
    );
    // Magic (6) + version (2) + length (2) + dict + '\n' is a multiple of 64.
    let unpadded = MAGIC.len() + 2 + 2 + dict.len() + 1;
    dict.push_str(&" ".repeat(unpadded.next_multiple_of(64) - unpadded));
    dict.push('\n');
    let mut out = Vec::with_capacity(10 + dict.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out
}

/// Writes `data` with `shape` to `w`.
pub fn write_to<T: Element>(
    mut w: impl Write,
    shape: &[usize],
    data: &[T],
) -> Result<(), NpyError> {
    let count: usize = shape.iter().product();
    if count != data.len() {
        return Err(NpyError::Format(format!(
            "shape {shape:?} holds {count} elements, found {} to write",
            data.len()
        )));
    }
    w.write_all(&header::<T>(shape))?;
    let mut bytes = Vec::with_capacity(data.len() * 4);
    for &x in data {
        bytes.extend_from_slice(&x.to_le());
    }
    w.write_all(&bytes)?;
    Ok(())
}

/// Writes `data` with `shape` to the file at `path`, creating its folder.
pub fn write<T: Element>(path: &Path, shape: &[usize], data: &[T]) -> Result<(), NpyError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let file = std::fs::File::create(path)?;
    write_to(io::BufWriter::new(file), shape, data)
}

fn field<'a>(dict: &'a str, key: &str) -> Option<&'a str> {
    let at = dict.find(&format!("'{key}':"))? + key.len() + 3;
    Some(dict[at..].trim_start())
}

/// Reads an array of `T` from `r`.
pub fn read_from<T: Element>(mut r: impl Read) -> Result<Array<T>, NpyError> {
    let mut pre = [0u8; 10];
    r.read_exact(&mut pre)?;
    if &pre[..6] != MAGIC {
        return Err(NpyError::Format(format!(
            "expected the .npy magic \\x93NUMPY, found {:?}",
            &pre[..6]
        )));
    }
    let len = match pre[6] {
        1 => u16::from_le_bytes([pre[8], pre[9]]) as usize,
        v => {
            return Err(NpyError::Format(format!(
                "expected .npy format version 1.0, found {v}.{}",
                pre[7]
            )));
        }
    };
    let mut dict = vec![0u8; len];
    r.read_exact(&mut dict)?;
    let dict = String::from_utf8_lossy(&dict).into_owned();
    let descr = field(&dict, "descr")
        .and_then(|s| s.strip_prefix('\''))
        .and_then(|s| s.split('\'').next())
        .ok_or_else(|| NpyError::Format(format!("no descr in the header {dict:?}")))?;
    if descr != T::DESCR {
        return Err(NpyError::Format(format!(
            "expected elements of type {}, found {descr}",
            T::DESCR
        )));
    }
    if field(&dict, "fortran_order").is_some_and(|s| s.starts_with("True")) {
        return Err(NpyError::Format(
            "expected C order, found Fortran order".into(),
        ));
    }
    let shape_text = field(&dict, "shape")
        .and_then(|s| s.strip_prefix('('))
        .and_then(|s| s.split(')').next())
        .ok_or_else(|| NpyError::Format(format!("no shape in the header {dict:?}")))?;
    let shape = shape_text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<usize>()
                .map_err(|_| NpyError::Format(format!("expected a dimension, found {s:?}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let count: usize = shape.iter().product();
    let mut bytes = vec![0u8; count * 4];
    r.read_exact(&mut bytes).map_err(|e| {
        NpyError::Format(format!("expected {count} elements after the header: {e}"))
    })?;
    let data = bytes
        .chunks_exact(4)
        .map(|c| T::from_le([c[0], c[1], c[2], c[3]]))
        .collect();
    Ok(Array { shape, data })
}

/// Reads an array of `T` from the file at `path`; errors name the file.
pub fn read<T: Element>(path: &Path) -> Result<Array<T>, NpyError> {
    let file = std::fs::File::open(path)
        .map_err(|e| NpyError::Format(format!("{}: {e}", path.display())))?;
    read_from(io::BufReader::new(file))
        .map_err(|e| NpyError::Format(format!("{}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_of_f32_and_i32_in_several_shapes() {
        for shape in [vec![], vec![5], vec![3, 4], vec![2, 3, 4]] {
            let n: usize = shape.iter().product();
            let f: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 1.25).collect();
            let mut buf = Vec::new();
            write_to(&mut buf, &shape, &f).unwrap();
            assert_eq!(buf.len() % 4, 0);
            assert_eq!((10 + u16::from_le_bytes([buf[8], buf[9]]) as usize) % 64, 0);
            assert_eq!(
                read_from::<f32>(&buf[..]).unwrap(),
                Array {
                    shape: shape.clone(),
                    data: f
                }
            );
            let i: Vec<i32> = (0..n as i32).map(|x| x * 7 - 3).collect();
            let mut buf = Vec::new();
            write_to(&mut buf, &shape, &i).unwrap();
            assert_eq!(read_from::<i32>(&buf[..]).unwrap().data, i);
        }
    }

    #[test]
    fn header_is_what_numpy_writes() {
        let mut buf = Vec::new();
        write_to(&mut buf, &[2, 3], &[0f32; 6]).unwrap();
        let text = String::from_utf8_lossy(&buf[10..]);
        assert!(
            text.starts_with("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"),
            "{text}"
        );
        let mut buf = Vec::new();
        write_to(&mut buf, &[7], &[0i32; 7]).unwrap();
        assert!(String::from_utf8_lossy(&buf[10..]).contains("'shape': (7,)"));
    }

    #[test]
    fn wrong_type_short_data_and_bad_magic_are_clear_errors() {
        let mut buf = Vec::new();
        write_to(&mut buf, &[3], &[1i32, 2, 3]).unwrap();
        let e = read_from::<f32>(&buf[..]).unwrap_err().to_string();
        assert!(
            e.contains("expected elements of type <f4, found <i4"),
            "{e}"
        );
        buf.truncate(buf.len() - 2);
        let e = read_from::<i32>(&buf[..]).unwrap_err().to_string();
        assert!(e.contains("expected 3 elements"), "{e}");
        let e = read_from::<f32>(&b"NOTNUMPY00"[..])
            .unwrap_err()
            .to_string();
        assert!(e.contains("magic"), "{e}");
        let e = write_to(Vec::new(), &[2, 2], &[1f32; 3])
            .unwrap_err()
            .to_string();
        assert!(e.contains("holds 4 elements, found 3"), "{e}");
    }
}
