//! What a trace hook costs: nanoseconds per `record` call while tracing is
//! off (the hot path: one relaxed load and a branch) and while it is on
//! (decoding and writing one JSON line).
//!
//! `cargo run --release -p p2plab-trace --example off_cost`

use std::hint::black_box;
use std::time::Instant;

use p2plab_trace::Tracer;

fn per_call(tracer: &Tracer, calls: u64) -> f64 {
    let start = Instant::now();
    for i in 0..calls {
        tracer.record("cmd", || serde_json::json!({"cid": black_box(i)}));
    }
    start.elapsed().as_nanos() as f64 / calls as f64
}

fn main() {
    let path = std::env::temp_dir().join(format!("p2plab-trace-cost-{}.jsonl", std::process::id()));
    let tracer = black_box(Tracer::new());
    tracer.configure(&path, "bench");
    let off = per_call(&tracer, 100_000_000);
    if let Err(e) = tracer.enable() {
        eprintln!("off_cost: {}: {e}", path.display());
        std::process::exit(1);
    }
    let on = per_call(&tracer, 100_000);
    tracer.disable();
    let _ = std::fs::remove_file(&path);
    println!("off: {off:.2} ns per hook; on: {on:.0} ns per event (JSON line written)");
}
