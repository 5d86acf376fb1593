//! Request lines as a host client or a guest (through its virtio-serial
//! port, `--guest-control-socket`) sends them, answered by the real
//! `Dispatcher` (`p2plab_server::control`) over the generic
//! `DeviceHandler` and the real control verbs of each device kind on
//! fakes: an NVMe controller, a GPU and a NIC on a loopback wire, each
//! with its trace capped at the smallest size. Input: one byte choosing
//! the device, one whose bits choose each line's channel, then any bytes,
//! cut into lines as the listener cuts them (a line of `MAX_LINE` bytes or
//! more ends the connection).
//!
//! Catches a panic in request parsing, the guest channel's rules or a
//! device's verbs; a reply that is not one JSON line
//! (`{"ok":true,"result":..}` or `{"ok":false,"error":".."}`); a line that
//! is not a request answered as if it were; an `inject` that succeeds but
//! whose id `status` does not show (or whose canonical spec the device
//! then refuses); a host `clear` that leaves an injection armed; a `reset`
//! answered ok on the guest channel; a trace file past its cap; a
//! `status` that is not an object.
#![no_main]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use p2plab_dma::testing::FakeGuestMemory;
use p2plab_dma::{GuestMemory, HeapRegion, RegionMemory};
use p2plab_gpu::regs::MIN_VRAM_SIZE;
use p2plab_gpu::{Gpu, Vram};
use p2plab_kit::{DeviceControl, Interrupts};
use p2plab_nic::{Nic, Wire};
use p2plab_nvme::server::NvmeControl;
use p2plab_nvme::{ControllerConfig, FileBackend, Namespace, NamespaceIds, NvmeController};
use p2plab_server::control::{Channel, ControlRequest, Dispatcher, MAX_LINE};
use p2plab_server::{DeviceHandler, DeviceStats};
use p2plab_vfio_user::DmaSpace;
use serde_json::Value;

const RAM: u64 = 0x10_0000;
const RAM_SIZE: usize = 64 << 10;
/// Lines per input: enough for inject, status, clear, status.
const MAX_LINES: usize = 16;

struct NoInterrupts;

impl Interrupts for NoInterrupts {
    fn notify(&self, _vector: u16) {}
}

/// The devices stay up across inputs (they start threads); each input
/// ends with a host `clear`.
struct Devices {
    dispatchers: Vec<(Dispatcher, PathBuf)>,
    _gpu: Gpu,
    _nic: Nic,
}

/// The smallest trace cap, so a fuzzed `trace` reaches it.
const TRACE_CAP: u64 = p2plab_trace::MIN_MAX_BYTES;

fn dispatcher(
    name: &str,
    control: Arc<dyn DeviceControl>,
    peer_bar: Option<u8>,
) -> (Dispatcher, PathBuf) {
    let trace = std::env::temp_dir().join(format!(
        "p2plab-fuzz-control-{}-{name}.trace.jsonl",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&trace);
    control
        .tracer()
        .set_max_bytes(TRACE_CAP)
        .expect("the smallest cap");
    control.tracer().configure(&trace, name);
    let stats = DeviceStats::new(control, DmaSpace::new(), None, peer_bar);
    (
        Dispatcher::new(Arc::new(DeviceHandler(Arc::new(stats)))),
        trace,
    )
}

fn devices() -> &'static Devices {
    static DEVICES: OnceLock<Devices> = OnceLock::new();
    DEVICES.get_or_init(|| {
        let ram = Arc::new(FakeGuestMemory::new().with_region(RAM, RAM_SIZE));
        let memory = ram as Arc<dyn GuestMemory>;
        let irq = Arc::new(NoInterrupts);
        let backend = Arc::new(FileBackend::memory("fuzz", 64 << 10).expect("memfd"));
        let ns = Arc::new(Namespace::new(
            1,
            backend,
            512,
            NamespaceIds::derive("FUZZ", 1, [2, 0x50, 0x4c]),
        ));
        let cmb_size = 2 << 20;
        let cmb: Arc<dyn RegionMemory> = Arc::new(HeapRegion::new(cmb_size as usize));
        let cfg = ControllerConfig {
            serial: "FUZZ".into(),
            cmb_size,
            ..ControllerConfig::default()
        };
        let nvme = NvmeController::with_queues_on_caller(
            cfg,
            vec![ns],
            memory.clone(),
            Some(cmb),
            irq.clone(),
        )
        .expect("the NVMe configuration is valid");
        let gpu = Gpu::new(
            Vram::new(MIN_VRAM_SIZE).expect("VRAM"),
            memory.clone(),
            irq.clone(),
        )
        .expect("GPU");
        let nic = Nic::new(Wire::loopback(), 1500, memory, irq).expect("NIC");
        Devices {
            dispatchers: vec![
                dispatcher("nvme0", Arc::new(NvmeControl(Arc::new(nvme))), Some(2)),
                dispatcher("gpu0", Arc::new(gpu.control()), Some(2)),
                dispatcher("nic0", Arc::new(nic.control()), None),
            ],
            _gpu: gpu,
            _nic: nic,
        }
    })
}

/// Parses a reply line: one line of JSON, `ok` with a result or an error.
fn parse(reply: &str) -> (bool, Value) {
    assert!(reply.ends_with('\n'), "reply without a newline: {reply:?}");
    assert_eq!(
        reply.matches('\n').count(),
        1,
        "reply of several lines: {reply:?}"
    );
    let value: Value = serde_json::from_str(reply).expect("the reply is JSON");
    let ok = value["ok"].as_bool().expect("the reply has a boolean ok");
    if ok {
        assert!(value.get("error").is_none(), "{reply}");
        (true, value.get("result").cloned().unwrap_or(Value::Null))
    } else {
        let error = value["error"].as_str().expect("a refusal says why");
        assert!(!error.is_empty());
        (false, Value::String(error.to_owned()))
    }
}

/// Every (id, spec) of an armed injection in a fault report, whatever
/// its shape (NVMe's object, the others' list).
fn armed_ids(report: &Value, out: &mut Vec<u64>) {
    match report {
        Value::Array(items) => items.iter().for_each(|v| armed_ids(v, out)),
        Value::Object(map) => {
            if let (Some(id), Some(Value::String(_))) = (map.get("id"), map.get("spec")) {
                out.push(id.as_u64().expect("an injection id is a number"));
            }
            map.values().for_each(|v| armed_ids(v, out));
        }
        _ => {}
    }
}

fn status(dispatcher: &Dispatcher) -> Value {
    let (ok, status) = parse(&dispatcher.reply_line(Channel::Host, br#"{"cmd":"status"}"#));
    assert!(ok && status.is_object(), "status: {status}");
    status
}

fn armed(dispatcher: &Dispatcher) -> Vec<u64> {
    let mut ids = Vec::new();
    armed_ids(&status(dispatcher)["faults"], &mut ids);
    ids
}

fuzz_target!(|data: &[u8]| {
    let [which, channels, bytes @ ..] = data else {
        return;
    };
    let devices = devices();
    let (dispatcher, trace) = &devices.dispatchers[usize::from(*which) % devices.dispatchers.len()];
    let mut lines = bytes.split(|&b| b == b'\n').peekable();
    let mut n = 0;
    while let Some(line) = lines.next() {
        // The listener answers only whole lines, and ends the connection
        // at MAX_LINE.
        if n == MAX_LINES || lines.peek().is_none() || line.len() as u64 >= MAX_LINE {
            break;
        }
        let channel = if channels >> (n % 8) & 1 == 1 {
            Channel::Guest
        } else {
            Channel::Host
        };
        n += 1;
        let reply = dispatcher.reply_line(channel, line);
        let (ok, result) = parse(&reply);
        let len = std::fs::metadata(trace).map_or(0, |m| m.len());
        assert!(
            len <= TRACE_CAP,
            "trace file of {len} bytes past its cap of {TRACE_CAP}"
        );
        let Ok(request) = serde_json::from_slice::<ControlRequest>(line.trim_ascii()) else {
            assert!(!ok, "not a request, answered: {line:?} -> {reply}");
            continue;
        };
        match request {
            ControlRequest::Status => assert!(ok && result.is_object(), "{reply}"),
            ControlRequest::Inject { .. } if ok => {
                let id = result["id"].as_u64().expect("an armed injection has an id");
                let spec = result["spec"].as_str().expect("and its canonical spec");
                assert!(
                    armed(dispatcher).contains(&id),
                    "armed {id} is not in status"
                );
                // The canonical form is a spec the device takes.
                let again = serde_json::json!({"cmd": "inject", "spec": spec}).to_string();
                let (ok, again) = parse(&dispatcher.reply_line(Channel::Host, again.as_bytes()));
                assert!(ok, "{spec:?} refused when armed again: {again}");
                assert_eq!(again["spec"].as_str(), Some(spec), "not canonical");
            }
            ControlRequest::Clear if channel == Channel::Host => {
                assert!(ok, "{reply}");
                assert_eq!(
                    armed(dispatcher),
                    Vec::<u64>::new(),
                    "clear left injections"
                );
            }
            ControlRequest::Reset if channel == Channel::Guest => {
                assert!(!ok, "the guest channel reset the device: {reply}");
            }
            ControlRequest::Inject { .. }
            | ControlRequest::Clear
            | ControlRequest::Reset
            | ControlRequest::Trace { .. } => {}
        }
    }
    let _ = dispatcher.reply_line(Channel::Host, br#"{"cmd":"clear"}"#);
});
