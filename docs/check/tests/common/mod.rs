//! What the reference-page tests share: the control verbs and the DMA
//! path names, both read from the code's own types.

#![allow(dead_code)]

use std::collections::BTreeSet;

use p2plab_docs::reference::{differences, Page};
use p2plab_server::control::ControlRequest;

/// The verb of a request. The match is exhaustive, so a new verb does not
/// compile until it is named here; add it to [`every_verb`] too.
pub fn verb(request: &ControlRequest) -> &'static str {
    match request {
        ControlRequest::Status => "status",
        ControlRequest::Inject { .. } => "inject",
        ControlRequest::Clear => "clear",
        ControlRequest::Reset => "reset",
        ControlRequest::Trace { .. } => "trace",
    }
}

/// One request of every verb.
pub fn every_verb() -> Vec<ControlRequest> {
    vec![
        ControlRequest::Status,
        ControlRequest::Inject { spec: "x".into() },
        ControlRequest::Clear,
        ControlRequest::Reset,
        ControlRequest::Trace { on: None },
    ]
}

/// Problems with a page's verb table under `heading`: each request must
/// parse as the verb its row names, and the verbs must be every verb.
pub fn control_verb_problems(page: &Page, heading: &str) -> Vec<String> {
    let rows = match page.rows(heading, &["verb", "request"]) {
        Ok(rows) => rows,
        Err(e) => return vec![e.to_string()],
    };
    let mut problems = Vec::new();
    let mut documented = BTreeSet::new();
    for row in &rows {
        match serde_json::from_str::<ControlRequest>(&row[1]) {
            Ok(request) if verb(&request) == row[0] => {}
            Ok(request) => problems.push(format!(
                "{}: the request {} is a {} request, not {}",
                page.path,
                row[1],
                verb(&request),
                row[0]
            )),
            Err(e) => problems.push(format!(
                "{}: {} is not a control request: {e}",
                page.path, row[1]
            )),
        }
        documented.insert(row[0].clone());
    }
    let code: BTreeSet<String> = every_verb().iter().map(|r| verb(r).to_string()).collect();
    problems.extend(differences(&page.path, "control verb", &documented, &code));
    problems
}

/// The DMA paths the transport counts. The pattern is exhaustive, so a
/// new path does not compile until it is named here.
pub fn dma_paths() -> BTreeSet<&'static str> {
    let p2plab_vfio_user::DmaStats {
        mmap: _,
        file: _,
        message: _,
        local: _,
        peer: _,
    } = p2plab_vfio_user::DmaStats::default();
    let p2plab_vfio_user::Traffic {
        read_ops: _,
        read_bytes: _,
        write_ops: _,
        write_bytes: _,
    } = p2plab_vfio_user::Traffic::default();
    ["mmap", "file", "message", "local", "peer"].into()
}

/// Problems with the DMA keys (`dma_<path>_<read|write>_<bytes|ops>`,
/// optionally under `dma.`) of the table under `heading`: each must name
/// a path and a counter the transport has. One way only: which of them a
/// server reports is its binary's choice.
pub fn dma_key_problems(page: &Page, heading: &str) -> Vec<String> {
    let rows = match page.rows(heading, &["key"]) {
        Ok(rows) => rows,
        Err(e) => return vec![e.to_string()],
    };
    let paths = dma_paths();
    let mut problems = Vec::new();
    let mut seen = 0;
    for row in rows {
        let key = row[0].strip_prefix("dma.").unwrap_or(&row[0]);
        let Some(rest) = key.strip_prefix("dma_") else {
            continue;
        };
        seen += 1;
        let known = ["read_bytes", "write_bytes", "read_ops", "write_ops"]
            .iter()
            .any(|counter| {
                rest.strip_suffix(counter)
                    .and_then(|p| p.strip_suffix('_'))
                    .is_some_and(|p| paths.contains(p))
            });
        if !known {
            problems.push(format!(
                "{}: {key} names no DMA path and counter of the transport ({paths:?})",
                page.path
            ));
        }
    }
    if seen == 0 {
        problems.push(format!("{}: no dma_ keys under {heading:?}", page.path));
    }
    problems
}

/// The device's own stats.json keys (the table under "stats.json") against
/// the keys its model's counters serialise (`code`, at least `min_keys` of
/// them, so a model that lost its counters fails too), both ways; and the
/// DMA keys the server binary adds (under "Added by the server binary").
pub fn stats_key_problems(page: &Page, code: &BTreeSet<String>, min_keys: usize) -> Vec<String> {
    let documented: BTreeSet<String> = match page.rows("stats.json", &["key"]) {
        Ok(rows) => rows.into_iter().map(|r| r[0].clone()).collect(),
        Err(e) => return vec![e.to_string()],
    };
    let mut problems = Vec::new();
    if code.len() < min_keys {
        problems.push(format!(
            "{}: the model serialises {} counters, fewer than {min_keys}: {code:?}",
            page.path,
            code.len()
        ));
    }
    problems.extend(differences(&page.path, "stats key", &documented, code));
    problems.extend(dma_key_problems(page, "Added by the server binary"));
    problems
}

/// Fails with every problem, one per line.
pub fn assert_none(problems: Vec<String>) {
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}
