//! Measured op costs: the small text file a step's automatic placement reads at compile
//! time, written by the runtime from a measurement of the step on a GPU.
//!
//! It holds, for every op instance of one step, its time alone and the share of the GPU
//! its kernels hold while it runs. The runtime writes it ([`OpCosts`]'s `Display`); the
//! `#[step]` macro parses it ([`OpCosts::parse`]) and checks that it describes the step
//! being compiled ([`OpCosts::stale`]): a file for other ops falls back to the `#[cost]`
//! hints, never to a wrong plan. Lines are plain so that a change to it reviews as a diff.
//!
//! ```text
//! # stepgraph op costs, format 1: each op's time alone (microseconds) and the share of
//! # the GPU its kernels hold (0 to 1). Measured on NVIDIA H200 (132 SMs).
//! step dqn
//! begin 2.10 0.001
//! draw_sample 5.32 0.120
//! ```

use std::fmt;

/// The format this crate writes and reads; a file of another format is stale.
pub const FORMAT: u32 = 1;

/// One op instance's measured cost.
#[derive(Clone, Debug, PartialEq)]
pub struct OpCost {
    /// The instance's name in the plan (`branch_forward[2]` for a replicated op).
    pub op: String,
    /// Its time alone, in microseconds.
    pub alone_us: f64,
    /// The share of the GPU its kernels hold while it runs, from 0 to 1.
    pub share: f64,
}

/// Every op instance's measured cost, for one step.
#[derive(Clone, Debug, PartialEq)]
pub struct OpCosts {
    /// The step's module name.
    pub step: String,
    /// What measured it, for the file's header (the device's name and SMs).
    pub measured_on: String,
    /// Op instances in program order.
    pub ops: Vec<OpCost>,
}

/// Why a costs file could not be read: the line (from 1) and what was expected there.
#[derive(Clone, Debug, PartialEq)]
pub struct ParseError {
    pub line: usize,
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

/// How a costs file differs from the step it is read for.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stale {
    /// The step the file names, where it is another.
    pub other_step: Option<String>,
    /// Op instances of the step the file lacks.
    pub missing: Vec<String>,
    /// Op instances the file has and the step does not.
    pub extra: Vec<String>,
}

impl fmt::Display for Stale {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(s) = &self.other_step {
            parts.push(format!("it was measured for step `{s}`"));
        }
        let list = |names: &[String]| {
            let shown: Vec<&str> = names.iter().take(4).map(String::as_str).collect();
            let more = names.len().saturating_sub(shown.len());
            let tail = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            format!("`{}`{tail}", shown.join("`, `"))
        };
        if !self.missing.is_empty() {
            parts.push(format!("it lacks {}", list(&self.missing)));
        }
        if !self.extra.is_empty() {
            parts.push(format!(
                "it has {}, which the step does not",
                list(&self.extra)
            ));
        }
        f.write_str(&parts.join("; "))
    }
}

impl OpCosts {
    /// Reads the text [`OpCosts`]'s `Display` writes. Blank lines and `#` comments are
    /// skipped, but for the header's `format N`.
    pub fn parse(text: &str) -> Result<OpCosts, ParseError> {
        let mut step = None;
        let mut measured_on = String::new();
        let mut format = None;
        let mut ops: Vec<OpCost> = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let err = |message: String| ParseError { line, message };
            let text = raw.trim();
            if let Some(comment) = text.strip_prefix('#') {
                if let Some(rest) = comment.trim().strip_prefix("stepgraph op costs, format ") {
                    let n = rest
                        .split(|c: char| !c.is_ascii_digit())
                        .next()
                        .unwrap_or("");
                    format = n.parse::<u32>().ok();
                }
                if let Some(on) = comment.trim().strip_prefix("Measured on ") {
                    measured_on = on.trim_end_matches('.').to_string();
                }
                continue;
            }
            if text.is_empty() {
                continue;
            }
            let words: Vec<&str> = text.split_whitespace().collect();
            if step.is_none() {
                match words.as_slice() {
                    ["step", name] => step = Some(name.to_string()),
                    _ => return Err(err(format!("expected `step NAME`, found `{text}`"))),
                }
                continue;
            }
            let [op, alone, share] = words.as_slice() else {
                return Err(err(format!(
                    "expected `OP MICROSECONDS SHARE`, found `{text}`"
                )));
            };
            let number = |w: &str, what: &str, most: f64| match w.parse::<f64>() {
                Ok(v) if v.is_finite() && (0.0..=most).contains(&v) => Ok(v),
                _ => Err(err(format!(
                    "expected {what} from 0 to {most} for `{op}`, found `{w}`"
                ))),
            };
            let cost = OpCost {
                op: op.to_string(),
                alone_us: number(alone, "a time in microseconds", 1e9)?,
                share: number(share, "a share of the GPU", 1.0)?,
            };
            if ops.iter().any(|o| o.op == cost.op) {
                return Err(err(format!("`{op}` is given twice")));
            }
            ops.push(cost);
        }
        match format {
            Some(FORMAT) => {}
            Some(n) => {
                return Err(ParseError {
                    line: 1,
                    message: format!("format {n}; this stepgraph reads format {FORMAT}"),
                });
            }
            None => {
                return Err(ParseError {
                    line: 1,
                    message: format!("expected the header `# stepgraph op costs, format {FORMAT}`"),
                });
            }
        }
        let Some(step) = step else {
            return Err(ParseError {
                line: text.lines().count().max(1),
                message: "expected `step NAME` and a line an op; found none".to_string(),
            });
        };
        Ok(OpCosts {
            step,
            measured_on,
            ops,
        })
    }

    /// How this file differs from the step `step` with these op instances, or `None`
    /// where it describes exactly them.
    pub fn stale<'a>(&self, step: &str, ops: impl IntoIterator<Item = &'a str>) -> Option<Stale> {
        let ops: Vec<&str> = ops.into_iter().collect();
        let stale = Stale {
            other_step: (self.step != step).then(|| self.step.clone()),
            missing: ops
                .iter()
                .filter(|n| !self.ops.iter().any(|o| o.op == **n))
                .map(|n| n.to_string())
                .collect(),
            extra: self
                .ops
                .iter()
                .filter(|o| !ops.contains(&o.op.as_str()))
                .map(|o| o.op.clone())
                .collect(),
        };
        (stale != Stale::default()).then_some(stale)
    }

    /// The measured cost of an op instance, by name.
    pub fn get(&self, op: &str) -> Option<&OpCost> {
        self.ops.iter().find(|o| o.op == op)
    }
}

impl fmt::Display for OpCosts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "# stepgraph op costs, format {FORMAT}: each op's time alone (microseconds) and the share of"
        )?;
        writeln!(
            f,
            "# the GPU its kernels hold (0 to 1), read by #[step(costs = ..)] to place the ops."
        )?;
        if !self.measured_on.is_empty() {
            writeln!(f, "# Measured on {}.", self.measured_on)?;
        }
        writeln!(f, "step {}", self.step)?;
        for op in &self.ops {
            // `+ 0.0`: an op with no kernels sums to -0.0, which would print as -0.00.
            writeln!(
                f,
                "{} {:.2} {:.3}",
                op.op,
                op.alone_us + 0.0,
                op.share + 0.0
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn costs() -> OpCosts {
        OpCosts {
            step: "dqn".into(),
            measured_on: "NVIDIA H200 (132 SMs)".into(),
            ops: vec![
                OpCost {
                    op: "begin".into(),
                    alone_us: 2.1,
                    share: 0.001,
                },
                OpCost {
                    op: "branch[1]".into(),
                    alone_us: 25.25,
                    share: 0.5,
                },
            ],
        }
    }

    #[test]
    fn what_is_written_reads_back() {
        let c = costs();
        assert_eq!(OpCosts::parse(&c.to_string()), Ok(c));
    }

    #[test]
    fn an_op_without_kernels_writes_zero_not_minus_zero() {
        let mut c = costs();
        c.ops[0].alone_us = -0.0;
        c.ops[0].share = -0.0;
        let text = c.to_string();
        assert!(text.contains("\nbegin 0.00 0.000\n"), "{text}");
    }

    #[test]
    fn a_step_of_other_ops_is_stale_naming_them() {
        let c = costs();
        assert_eq!(c.stale("dqn", ["begin", "branch[1]"]), None);
        let s = c.stale("sac", ["begin", "branch[0]"]).unwrap();
        assert_eq!(s.other_step.as_deref(), Some("dqn"));
        assert_eq!(s.missing, ["branch[0]"]);
        assert_eq!(s.extra, ["branch[1]"]);
        let text = s.to_string();
        assert!(
            text.contains("step `dqn`") && text.contains("lacks `branch[0]`"),
            "{text}"
        );
    }

    #[test]
    fn each_mistake_names_its_line_and_what_was_expected() {
        let header = "# stepgraph op costs, format 1: x\n";
        let cases = [
            ("step a\nx 1 0.5\n", 1, "header"),
            ("# stepgraph op costs, format 2: x\nstep a\n", 1, "format 2"),
            (&*format!("{header}x 1 0.5\n"), 2, "`step NAME`"),
            (
                &*format!("{header}step a\nx 1\n"),
                3,
                "`OP MICROSECONDS SHARE`",
            ),
            (&*format!("{header}step a\nx -1 0.5\n"), 3, "microseconds"),
            (&*format!("{header}step a\nx 1 1.5\n"), 3, "share"),
            (&*format!("{header}step a\nx 1 0.5\nx 2 0.5\n"), 4, "twice"),
            (header, 1, "found none"),
        ];
        for (text, line, word) in cases {
            let e = OpCosts::parse(text).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e}");
            assert!(e.message.contains(word), "{text:?}: {e}");
        }
    }
}
