//! What the unit tests share: a fork-join profile and queries over a parsed SVG.

use stepgraph_plan::{OpTiming, Profile, WaitEdge};

pub(crate) fn op(name: &str, func: &str, stream: usize, start_ms: f64, end_ms: f64) -> OpTiming {
    OpTiming {
        name: name.into(),
        func: func.into(),
        stream,
        start_ms,
        end_ms,
    }
}

/// A fork and join over two side streams: `seed` on main, `chain[0]` and `chain[1]`
/// on their own streams, `total` back on main after both.
pub(crate) fn fork_join() -> Profile {
    Profile {
        step: "fork_join".into(),
        device: "Test GPU <&> \"quoted\"".into(),
        streams: vec!["main".into(), "chain[0]".into(), "chain[1]".into()],
        ops: vec![
            op("seed", "seed", 0, 0.0, 0.005),
            op("chain[0]", "chain", 1, 0.008, 0.35),
            op("chain[1]", "chain", 2, 0.009, 0.362),
            op("total", "total", 0, 0.364, 0.374),
        ],
        waits: vec![
            WaitEdge { from: 0, to: 1 },
            WaitEdge { from: 0, to: 2 },
            WaitEdge { from: 1, to: 3 },
            WaitEdge { from: 2, to: 3 },
        ],
        critical_path: vec![0, 2, 3],
        total_ms: 0.374,
    }
}

pub(crate) fn parse(svg: &str) -> roxmltree::Document<'_> {
    roxmltree::Document::parse(svg).unwrap_or_else(|e| panic!("not well-formed: {e}\n{svg}"))
}

pub(crate) fn has_class(n: &roxmltree::Node<'_, '_>, class: &str) -> bool {
    n.attribute("class")
        .is_some_and(|c| c.split(' ').any(|t| t == class))
}

pub(crate) fn with_class<'a>(
    doc: &'a roxmltree::Document<'a>,
    class: &str,
) -> Vec<roxmltree::Node<'a, 'a>> {
    doc.descendants().filter(|n| has_class(n, class)).collect()
}

pub(crate) fn title_of(n: &roxmltree::Node<'_, '_>) -> String {
    n.children()
        .find(|c| c.has_tag_name("title"))
        .and_then(|t| t.text())
        .unwrap_or_default()
        .to_string()
}
