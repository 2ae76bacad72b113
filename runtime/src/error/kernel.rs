//! How a kernel's parameters and a launch's arguments can disagree: the detail of the
//! kernel errors, kept with the error enum so that every layer can name it.

use std::fmt;

/// A parameter of a loaded kernel: where and how large it is in the kernel's parameter
/// buffer (from the driver), and its name and C type where a declaration gave them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Param {
    /// Byte offset in the parameter buffer.
    pub offset: usize,
    /// Size in bytes.
    pub size: usize,
    /// Declared name.
    pub name: Option<&'static str>,
    /// Declared C type.
    pub c_type: Option<&'static str>,
}

impl Param {
    /// ` `n``, or nothing for a parameter without a declared name.
    fn named(&self) -> String {
        match self.name {
            Some(n) if !n.is_empty() => format!(" `{n}`"),
            _ => String::new(),
        }
    }
}

/// How a declared parameter list differs from the loaded kernel's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SignatureMismatch {
    /// Different numbers of parameters.
    Count {
        /// Parameters declared.
        declared: usize,
        /// Parameters of the loaded kernel.
        loaded: usize,
    },
    /// A parameter of a different size.
    Size {
        /// Its position.
        index: usize,
        /// Its declared name (empty if unnamed).
        name: &'static str,
        /// Its declared C type.
        c_type: &'static str,
        /// Its declared size.
        declared: usize,
        /// Its size in the loaded kernel.
        loaded: usize,
    },
}

impl fmt::Display for SignatureMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            SignatureMismatch::Count { declared, loaded } => write!(
                f,
                "declared with {declared} parameters, the loaded kernel takes {loaded}"
            ),
            SignatureMismatch::Size {
                index,
                name,
                c_type,
                declared,
                loaded,
            } => {
                let name = if name.is_empty() {
                    String::new()
                } else {
                    format!(" `{name}`")
                };
                write!(
                    f,
                    "parameter {index}{name} is declared {c_type} ({declared} bytes), the loaded \
                     kernel takes {loaded} bytes"
                )
            }
        }
    }
}

/// How a launch's arguments differ from its kernel's parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ArgMismatch {
    /// A different number of arguments.
    Count {
        /// Parameters the kernel takes.
        expected: usize,
        /// Arguments pushed.
        found: usize,
        /// The first parameter without an argument, if there were too few.
        missing: Option<Param>,
    },
    /// An argument of a different size than its parameter (the first such).
    Size {
        /// Its position.
        index: usize,
        /// The parameter.
        param: Param,
        /// The argument's size in bytes.
        found: usize,
    },
}

impl fmt::Display for ArgMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ArgMismatch::Count {
                expected,
                found,
                missing,
            } => {
                write!(
                    f,
                    "it takes {expected} arguments, the launch passed {found}"
                )?;
                if let Some(p) = missing {
                    write!(f, " (the first missing is argument {found}{}", p.named())?;
                    if let Some(t) = p.c_type {
                        write!(f, ", {t}")?;
                    }
                    write!(f, ")")?;
                }
                Ok(())
            }
            ArgMismatch::Size {
                index,
                param,
                found,
            } => match param.c_type {
                Some(t) => write!(
                    f,
                    "argument {index}{} is {t} ({} bytes), the launch passed {found} bytes",
                    param.named(),
                    param.size
                ),
                None => write!(
                    f,
                    "argument {index} takes {} bytes, the launch passed {found}",
                    param.size
                ),
            },
        }
    }
}

/// What the driver allows of dynamic shared memory per block, as far as it could be read,
/// for [`Error::DynamicShared`].
pub(crate) fn shared_limit(optin: Option<u32>, static_bytes: Option<u32>) -> String {
    match (optin, static_bytes) {
        (Some(optin), Some(0)) => {
            format!("the device allows at most {optin} (its opt-in maximum)")
        }
        (Some(optin), Some(fixed)) => format!(
            "the device allows at most {} (its opt-in maximum of {optin} less the kernel's \
             {fixed} bytes of static shared memory)",
            optin.saturating_sub(fixed)
        ),
        (Some(optin), None) => format!(
            "the device's opt-in maximum is {optin}, less the kernel's static shared memory \
             (which could not be read)"
        ),
        (None, _) => "the device's opt-in maximum could not be read".to_string(),
    }
}
