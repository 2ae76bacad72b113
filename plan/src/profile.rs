//! Measured profiles of a step: per-op start and end times on each stream, from a
//! separate capture of the step with timing events around every op. The normal graph
//! carries no timing events; this one is replayed on demand.

use std::fmt;

/// One op's measured interval in one profiled replay.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Debug, PartialEq)]
pub struct OpTiming {
    /// The op's name in the plan (`branch_fwd[2]`).
    pub name: String,
    /// The function name shared by a replicated op's instances (`branch_fwd`): the
    /// "part" of the step it belongs to, for per-part breakdowns.
    pub func: String,
    /// Index of the stream in [`Profile::streams`].
    pub stream: usize,
    /// Start, in milliseconds after the replay began.
    pub start_ms: f64,
    /// End, in milliseconds after the replay began.
    pub end_ms: f64,
}

impl OpTiming {
    /// `end_ms - start_ms`.
    pub fn duration_ms(&self) -> f64 {
        self.end_ms - self.start_ms
    }
}

/// A cross-stream wait of the plan: op `to` waited for op `from` (indices into
/// [`Profile::ops`]).
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitEdge {
    /// The op the event was recorded after.
    pub from: usize,
    /// The op whose stream waited.
    pub to: usize,
}

/// A profiled replay of a step.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    /// The step's name.
    pub step: String,
    /// The device it ran on (its name as the driver reports it).
    pub device: String,
    /// Stream names, origin first.
    pub streams: Vec<String>,
    /// Ops in program order.
    pub ops: Vec<OpTiming>,
    /// Cross-stream waits (joins), drawn as arrows.
    pub waits: Vec<WaitEdge>,
    /// The measured critical path: the longest chain through the schedule (stream order
    /// and waits) weighted by each op's measured duration, as op indices.
    pub critical_path: Vec<usize>,
    /// Wall time of the whole profiled replay, from its first op's start to its last
    /// op's end, in milliseconds.
    pub total_ms: f64,
}

impl Profile {
    /// Sum of the durations of the ops on the critical path. Indices past the ops (a
    /// hand-built profile with a stale path) are skipped.
    pub fn critical_path_ms(&self) -> f64 {
        self.critical_path
            .iter()
            .filter_map(|&i| self.ops.get(i))
            .map(OpTiming::duration_ms)
            .sum()
    }

    /// The intervals during which some op of a stream `on` accepts is running, merged
    /// and in order.
    fn busy_intervals(&self, on: impl Fn(usize) -> bool) -> Vec<(f64, f64)> {
        let mut iv: Vec<(f64, f64)> = self
            .ops
            .iter()
            .filter(|o| on(o.stream))
            .map(|o| (o.start_ms, o.end_ms))
            .collect();
        iv.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut merged: Vec<(f64, f64)> = Vec::with_capacity(iv.len());
        for (a, z) in iv {
            match merged.last_mut() {
                Some(last) if a <= last.1 => last.1 = last.1.max(z),
                _ => merged.push((a, z)),
            }
        }
        merged
    }

    /// Busy time of each stream: the union of its ops' intervals, in milliseconds.
    pub fn stream_busy_ms(&self) -> Vec<f64> {
        (0..self.streams.len())
            .map(|s| {
                self.busy_intervals(|o| o == s)
                    .iter()
                    .map(|(a, z)| z - a)
                    .sum()
            })
            .collect()
    }

    /// The fraction of stream `stream`'s op time during which another stream was busy
    /// too: for a communication stream, the collective time hidden behind computation.
    /// `None` for an unknown stream or one that did nothing.
    pub fn hidden_fraction(&self, stream: &str) -> Option<f64> {
        let c = self.streams.iter().position(|s| s == stream)?;
        let others = self.busy_intervals(|o| o != c);
        let (mut busy, mut hidden) = (0.0, 0.0);
        for op in self.ops.iter().filter(|o| o.stream == c) {
            busy += op.duration_ms();
            for &(a, z) in &others {
                hidden += (op.end_ms.min(z) - op.start_ms.max(a)).max(0.0);
            }
        }
        (busy > 0.0).then(|| hidden / busy)
    }

    /// How much the streams overlapped: the sum of all streams' busy time over the
    /// replay's wall time (1.0 means no overlap at all; 4.0, four streams busy
    /// throughout).
    pub fn overlap(&self) -> f64 {
        if self.total_ms <= 0.0 {
            return 0.0;
        }
        self.stream_busy_ms().iter().sum::<f64>() / self.total_ms
    }

    /// Each op's duration in program order: the costs `PlanDesc::longest_path` takes for a
    /// critical path with every op at its measured time.
    pub fn durations_ms(&self) -> Vec<f64> {
        self.ops.iter().map(OpTiming::duration_ms).collect()
    }

    /// A markdown table of every op's time in `alone` (a profile of the same plan with
    /// one op at a time: the one-stream step's) against its time here, and their ratio:
    /// where ops that run side by side slow each other. Ops are paired in program order.
    pub fn contention_table(&self, alone: &Profile) -> String {
        let mut t =
            String::from("| op | alone ms | in parallel ms | ratio |\n| --- | --- | --- | --- |\n");
        for (a, p) in alone.ops.iter().zip(&self.ops) {
            t.push_str(&format!(
                "| {} | {:.4} | {:.4} | {:.2} |\n",
                a.name,
                a.duration_ms(),
                p.duration_ms(),
                p.duration_ms() / a.duration_ms().max(1e-9)
            ));
        }
        t
    }

    /// Total op time per part of the step (the op's function name), in first-seen
    /// order. Replicated instances of one op add up.
    pub fn by_part(&self) -> Vec<(String, f64)> {
        let mut parts: Vec<(String, f64)> = Vec::new();
        for op in &self.ops {
            match parts.iter_mut().find(|(n, _)| *n == op.func) {
                Some((_, t)) => *t += op.duration_ms(),
                None => parts.push((op.func.clone(), op.duration_ms())),
            }
        }
        parts
    }
}

impl fmt::Display for Profile {
    /// A compact table: one row per op, then per-stream busy time, the critical path and
    /// the overlap.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "profile `{}` on {}: {:.3} ms, {} ops on {} streams",
            self.step,
            self.device,
            self.total_ms,
            self.ops.len(),
            self.streams.len()
        )?;
        let sw = self.streams.iter().map(String::len).max().unwrap_or(4);
        let nw = self
            .ops
            .iter()
            .map(|o| o.name.len())
            .max()
            .unwrap_or(2)
            .max(2);
        writeln!(
            f,
            "  {:<nw$}  {:<sw$}  {:>9}  {:>9}  {:>9}",
            "op", "stream", "start ms", "end ms", "ms"
        )?;
        for (i, op) in self.ops.iter().enumerate() {
            let mark = if self.critical_path.contains(&i) {
                "*"
            } else {
                " "
            };
            writeln!(
                f,
                "{mark} {:<nw$}  {:<sw$}  {:>9.4}  {:>9.4}  {:>9.4}",
                op.name,
                self.streams.get(op.stream).map_or("?", String::as_str),
                op.start_ms,
                op.end_ms,
                op.duration_ms()
            )?;
        }
        let busy = self.stream_busy_ms();
        let per_stream: Vec<String> = self
            .streams
            .iter()
            .zip(&busy)
            .map(|(s, b)| format!("{s}={b:.3}"))
            .collect();
        writeln!(f, "  stream busy ms: {}", per_stream.join(" "))?;
        writeln!(
            f,
            "  critical path (*): {:.3} ms of {:.3} ms measured ({:.1}%), overlap {:.2}x",
            self.critical_path_ms(),
            self.total_ms,
            100.0 * self.critical_path_ms() / self.total_ms.max(f64::MIN_POSITIVE),
            self.overlap()
        )?;
        let parts: Vec<String> = self
            .by_part()
            .iter()
            .map(|(p, t)| format!("{p}={t:.3}"))
            .collect();
        write!(f, "  step breakdown (ms): {}", parts.join(" "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(name: &str, stream: usize, start_ms: f64, end_ms: f64) -> OpTiming {
        OpTiming {
            name: name.into(),
            func: name
                .trim_end_matches(|c: char| c == ']' || c.is_ascii_digit() || c == '[')
                .into(),
            stream,
            start_ms,
            end_ms,
        }
    }

    #[test]
    fn hidden_fraction_counts_comm_time_under_other_streams() {
        let p = Profile {
            step: "t".into(),
            device: "test".into(),
            streams: vec!["main".into(), "side".into(), "comm".into()],
            ops: vec![
                op("a", 0, 0.0, 1.0),
                op("b", 1, 0.5, 2.0),
                // 1.5..2.5: hidden 0.5 of 1.0.
                op("reduce_x", 2, 1.5, 2.5),
                // 3..4: nothing else runs.
                op("reduce_y", 2, 3.0, 4.0),
            ],
            waits: vec![],
            critical_path: vec![],
            total_ms: 4.0,
        };
        let f = p.hidden_fraction("comm").unwrap();
        assert!((f - 0.25).abs() < 1e-12, "{f}");
        assert_eq!(p.hidden_fraction("nope"), None);
    }

    #[test]
    fn the_contention_table_sets_each_op_alone_beside_its_time_in_parallel() {
        let profile = |ops| Profile {
            step: "t".into(),
            device: "test".into(),
            streams: vec!["main".into(), "side".into()],
            ops,
            waits: vec![],
            critical_path: vec![],
            total_ms: 3.0,
        };
        let alone = profile(vec![op("a", 0, 0.0, 1.0), op("b", 0, 1.0, 1.5)]);
        let parallel = profile(vec![op("a", 0, 0.0, 1.0), op("b", 1, 0.0, 1.25)]);
        assert_eq!(parallel.durations_ms(), vec![1.0, 1.25]);
        assert_eq!(
            parallel.contention_table(&alone),
            "| op | alone ms | in parallel ms | ratio |\n| --- | --- | --- | --- |\n\
             | a | 1.0000 | 1.0000 | 1.00 |\n| b | 0.5000 | 1.2500 | 2.50 |\n"
        );
    }

    #[test]
    fn busy_time_merges_overlapping_intervals_and_overlap_counts_streams() {
        let p = Profile {
            step: "t".into(),
            device: "test".into(),
            streams: vec!["main".into(), "side".into()],
            ops: vec![
                op("a", 0, 0.0, 1.0),
                op("b", 1, 0.5, 2.0),
                op("c", 1, 1.5, 2.5),
                op("d", 0, 2.5, 3.0),
            ],
            waits: vec![WaitEdge { from: 2, to: 3 }],
            critical_path: vec![1, 2, 3],
            total_ms: 3.0,
        };
        assert_eq!(p.stream_busy_ms(), vec![1.5, 2.0]);
        assert!((p.overlap() - 3.5 / 3.0).abs() < 1e-12);
        assert!((p.critical_path_ms() - 3.0).abs() < 1e-12);
        let text = p.to_string();
        assert!(
            text.contains("stream busy ms: main=1.500 side=2.000"),
            "{text}"
        );
    }

    #[test]
    fn a_stale_path_or_stream_index_is_skipped_or_shown_as_unknown() {
        let p = Profile {
            step: "t".into(),
            device: "test".into(),
            streams: vec!["main".into()],
            ops: vec![op("a", 0, 0.0, 1.0), op("b", 3, 1.0, 3.0)],
            waits: vec![],
            critical_path: vec![0, 1, 7],
            total_ms: 3.0,
        };
        assert!((p.critical_path_ms() - 3.0).abs() < 1e-12);
        let text = p.to_string();
        assert!(text.contains("* b   ?     "), "{text}");
    }
}
