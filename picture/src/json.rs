//! JSON as the trace and the record are written: serde_json's output with one item per
//! line. The top object puts each field on a line of its own and its arrays each element
//! (an op, a trace event); anything deeper stays on the element's line. A committed
//! record or trace then diffs op by op, where serde_json's compact form is one line and
//! its pretty form spreads every op over seven.

use std::io;

use serde::Serialize;
use serde_json::ser::Formatter;

/// Containers at this depth or shallower (the top object is depth 1) put each member on
/// a line of its own.
const SPREAD_DEPTH: usize = 2;
const INDENT: &[u8] = b"  ";

/// `value` as JSON, one item per line as the module says, ending with a newline.
pub(crate) fn to_string<T: Serialize>(value: &T) -> serde_json::Result<String> {
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, Lines::default());
    value.serialize(&mut ser)?;
    out.push(b'\n');
    // serde_json writes only UTF-8 (the strings it is given and its own ASCII), so
    // nothing is replaced here.
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// A [`Formatter`] that spreads the containers down to [`SPREAD_DEPTH`] over lines, like
/// serde_json's `PrettyFormatter`, and writes deeper ones on one line with a space after
/// each `,` and `:`. Strings and numbers are left to the trait's defaults, which are
/// serde_json's compact output.
#[derive(Default)]
struct Lines {
    /// How many containers are open.
    depth: usize,
    /// Whether the innermost open container has a member yet.
    has_value: bool,
}

impl Lines {
    fn spread(&self) -> bool {
        self.depth <= SPREAD_DEPTH
    }

    fn begin<W: ?Sized + io::Write>(&mut self, w: &mut W, bracket: &[u8]) -> io::Result<()> {
        self.depth += 1;
        self.has_value = false;
        w.write_all(bracket)
    }

    fn end<W: ?Sized + io::Write>(&mut self, w: &mut W, bracket: &[u8]) -> io::Result<()> {
        if self.spread() && self.has_value {
            w.write_all(b"\n")?;
            indent(w, self.depth - 1)?;
        }
        self.depth -= 1;
        w.write_all(bracket)
    }

    fn member<W: ?Sized + io::Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        if self.spread() {
            w.write_all(if first { b"\n" } else { b",\n" })?;
            indent(w, self.depth)
        } else if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }
}

fn indent<W: ?Sized + io::Write>(w: &mut W, depth: usize) -> io::Result<()> {
    for _ in 0..depth {
        w.write_all(INDENT)?;
    }
    Ok(())
}

impl Formatter for Lines {
    fn begin_array<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.begin(w, b"[")
    }

    fn end_array<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.end(w, b"]")
    }

    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.member(w, first)
    }

    fn end_array_value<W: ?Sized + io::Write>(&mut self, _: &mut W) -> io::Result<()> {
        self.has_value = true;
        Ok(())
    }

    fn begin_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.begin(w, b"{")
    }

    fn end_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.end(w, b"}")
    }

    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.member(w, first)
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(b": ")
    }

    fn end_object_value<W: ?Sized + io::Write>(&mut self, _: &mut W) -> io::Result<()> {
        self.has_value = true;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_top_two_levels_are_spread_over_lines_and_deeper_ones_are_not() {
        let value = json!({
            "name": "x",
            "empty": [],
            "none": {},
            "items": [{"a": 1, "b": [1, 2]}, {"a": 2, "b": []}],
            "meta": {"k": "v"}
        });
        let text = to_string(&value).unwrap();
        assert_eq!(
            text,
            r#"{
  "empty": [],
  "items": [
    {"a": 1, "b": [1, 2]},
    {"a": 2, "b": []}
  ],
  "meta": {
    "k": "v"
  },
  "name": "x",
  "none": {}
}
"#
        );
        let back: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back, value);
    }

    #[test]
    fn strings_and_numbers_are_written_as_serde_json_writes_them() {
        let value = json!(["tab\t\"quote\"\\ \u{1}é", 0.1, 1e300, -0.0, 7]);
        let text = to_string(&value).unwrap();
        let compact = serde_json::to_string(&value).unwrap();
        assert_eq!(text.replace(['\n', ' '], ""), compact.replace(' ', ""));
        assert!(text.contains(r#""tab\t\"quote\"\\ \u0001é""#), "{text}");
    }
}
