//! Control-socket request lines as a host client or a guest (through its
//! virtio-serial port, `--guest-control-socket`) sends them: any bytes,
//! cut into lines as the listener cuts them (a line of `MAX_LINE` bytes or
//! more ends the connection), each line on the channel the first byte's
//! bits choose, answered by the real `Dispatcher` over a real GPU model's
//! control verbs (status, inject, clear, reset) and its trace, capped at
//! the smallest size. Catches a panic in request parsing, the guest
//! channel's rules or a device verb; a reply that is not one JSON line; a
//! reset answered ok on the guest channel; a trace file past its cap.
#![no_main]

use std::path::PathBuf;
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use p2plab_dma::testing::FakeGuestMemory;
use p2plab_dma::GuestMemory;
use p2plab_gpu::regs::MIN_VRAM_SIZE;
use p2plab_gpu::{Gpu, Vram};
use p2plab_kit::testing::RecordingInterrupts;
use p2plab_kit::DeviceControl;
use p2plab_server::control::{Channel, ControlRequest, Dispatcher, MAX_LINE};
use p2plab_server::{DeviceHandler, DeviceStats};
use p2plab_vfio_user::DmaSpace;
use serde_json::Value;

fn trace_path() -> PathBuf {
    std::env::temp_dir().join(format!("p2plab-fuzz-control-{}.trace.jsonl", std::process::id()))
}

fuzz_target!(|data: &[u8]| {
    let Some((&channels, bytes)) = data.split_first() else {
        return;
    };
    let Ok(vram) = Vram::new(MIN_VRAM_SIZE) else {
        return;
    };
    let ram = Arc::new(FakeGuestMemory::new().with_region(0, 1 << 16));
    let Ok(gpu) = Gpu::new(vram, ram as Arc<dyn GuestMemory>, RecordingInterrupts::new()) else {
        return;
    };
    let control: Arc<dyn DeviceControl> = Arc::new(gpu.control());
    let trace = trace_path();
    let _ = std::fs::remove_file(&trace);
    let cap = p2plab_trace::MIN_MAX_BYTES;
    control.tracer().set_max_bytes(cap).expect("the smallest cap");
    control.tracer().configure(&trace, "gpu0");
    let stats = DeviceStats::new(control, DmaSpace::new(), None, None);
    let dispatcher = Dispatcher::new(Arc::new(DeviceHandler(Arc::new(stats))));
    let mut lines = bytes.split(|&b| b == b'\n').peekable();
    let mut n = 0;
    while let Some(line) = lines.next() {
        // The listener answers only whole lines, and ends the connection
        // at MAX_LINE.
        if lines.peek().is_none() || line.len() as u64 >= MAX_LINE {
            break;
        }
        let channel = if channels >> (n % 8) & 1 == 1 {
            Channel::Guest
        } else {
            Channel::Host
        };
        n += 1;
        let reply = dispatcher.reply_line(channel, line);
        assert!(
            reply.ends_with('\n') && reply.matches('\n').count() == 1,
            "{reply:?}"
        );
        let value: Value = serde_json::from_str(&reply).expect("the reply is JSON");
        let ok = value["ok"].as_bool().expect("the reply says ok or not");
        let request = serde_json::from_slice::<ControlRequest>(line.trim_ascii());
        if channel == Channel::Guest && matches!(request, Ok(ControlRequest::Reset)) {
            assert!(!ok, "the guest channel reset the device: {reply}");
        }
        let len = std::fs::metadata(&trace).map_or(0, |m| m.len());
        assert!(len <= cap, "trace file of {len} bytes past its cap of {cap}");
    }
    let _ = std::fs::remove_file(&trace);
});
