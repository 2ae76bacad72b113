//! The crate's one error type.

/// A `--print-plan` value this crate does not draw, or a profile record it cannot read or
/// write. Each message says what was expected and what was found; a record's also says
/// where (`ops[3].stream`), and a syntax error's source gives the line and column.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `--print-plan` was given a value other than `dot` or `svg`, or none.
    #[error("--print-plan: expected `dot` or `svg`, found `{found}`")]
    PlanFormat {
        /// The value given (empty when none followed the flag).
        found: String,
    },
    /// The text is not JSON, or not shaped like a record: a field is missing or holds
    /// the wrong type. The source names the problem, its line and its column.
    #[error("profile record: not JSON in the record's shape")]
    RecordSyntax(#[source] serde_json::Error),
    /// The record's `format` field is missing or names another format.
    #[error("profile record: expected format `{expected}`, found {found}")]
    RecordFormat {
        /// The format this crate reads ([`record::FORMAT`](crate::record::FORMAT)).
        expected: &'static str,
        /// What the record has instead: the field's JSON, or that it has none.
        found: String,
    },
    /// The record is of another version than this crate reads, or is the line-based
    /// text record of version 1.
    #[error("profile record: expected version {expected}, found {found}")]
    RecordVersion {
        /// The version this crate reads ([`record::VERSION`](crate::record::VERSION)).
        expected: u32,
        /// What the record has instead: the field's JSON, or that it has none.
        found: String,
    },
    /// serde_json could not write a trace or a record (its own error is the source; a
    /// profile of strings, integers and finite numbers always serialises).
    #[error("writing JSON failed")]
    Write(#[source] serde_json::Error),
    /// A value breaks a rule of the record: an index out of range, a time that is not
    /// finite, an op that ends before it starts.
    #[error("profile record: {at}: expected {expected}, found `{found}`")]
    RecordValue {
        /// The field, as a path into the record (`ops[3].end_ms`), and the op's name when
        /// it is an op's.
        at: String,
        /// What the rule allows there.
        expected: String,
        /// The value there.
        found: String,
    },
}
