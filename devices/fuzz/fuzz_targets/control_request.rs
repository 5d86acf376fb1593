//! Request lines through p2plab-server's control handler, as the control
//! socket serves them (`p2plab_server::control::reply_line` over the
//! generic `DeviceHandler`), to the real control verbs of each device
//! kind on fakes: an NVMe controller, a GPU and a NIC on a loopback wire.
//! Input: one byte choosing the device, then any text, split into lines.
//!
//! Catches a panic in the handler or a device's verbs, a reply that is not
//! one JSON line (`{"ok":true,"result":..}` or `{"ok":false,"error":".."}`),
//! a line that is not a request answered as if it were, an `inject` that
//! succeeds but whose id `status` does not show (or whose canonical spec
//! the device then refuses), a `clear` that leaves an injection armed, and
//! a `status` that is not an object.
#![no_main]

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
use p2plab_server::control::{reply_line, ControlRequest};
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
/// ends with a `clear`.
struct Devices {
    handlers: Vec<DeviceHandler>,
    _gpu: Gpu,
    _nic: Nic,
}

fn handler(control: Arc<dyn DeviceControl>, peer_bar: Option<u8>) -> DeviceHandler {
    DeviceHandler(Arc::new(DeviceStats::new(
        control,
        DmaSpace::new(),
        None,
        peer_bar,
    )))
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
            handlers: vec![
                handler(Arc::new(NvmeControl(Arc::new(nvme))), Some(2)),
                handler(Arc::new(gpu.control()), Some(2)),
                handler(Arc::new(nic.control()), None),
            ],
            _gpu: gpu,
            _nic: nic,
        }
    })
}

/// Parses a reply line: one line of JSON, `ok` with a result or an error.
fn parse(reply: &str) -> (bool, Value) {
    assert!(reply.ends_with('\n'), "reply without a newline: {reply:?}");
    assert_eq!(reply.matches('\n').count(), 1, "reply of several lines: {reply:?}");
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

fn status(handler: &DeviceHandler) -> Value {
    let (ok, status) = parse(&reply_line(handler, r#"{"cmd":"status"}"#).expect("reply"));
    assert!(ok && status.is_object(), "status: {status}");
    status
}

fn armed(handler: &DeviceHandler) -> Vec<u64> {
    let mut ids = Vec::new();
    armed_ids(&status(handler)["faults"], &mut ids);
    ids
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, text)) = data.split_first() else {
        return;
    };
    let devices = devices();
    let handler = &devices.handlers[usize::from(which) % devices.handlers.len()];
    // The socket reads lines as UTF-8 (an invalid line ends the
    // connection before the handler sees it).
    let Ok(text) = std::str::from_utf8(text) else {
        return;
    };
    for line in text.split('\n').take(MAX_LINES) {
        let reply = reply_line(handler, line).expect("a reply serialises");
        let (ok, result) = parse(&reply);
        let Ok(request) = serde_json::from_str::<ControlRequest>(line.trim()) else {
            assert!(!ok, "not a request, answered: {line:?} -> {reply}");
            assert!(result.as_str().is_some_and(|e| e.starts_with("bad request")));
            continue;
        };
        match request {
            ControlRequest::Status => assert!(ok && result.is_object(), "{reply}"),
            ControlRequest::Inject { .. } if ok => {
                let id = result["id"].as_u64().expect("an armed injection has an id");
                let spec = result["spec"].as_str().expect("and its canonical spec");
                assert!(armed(handler).contains(&id), "armed {id} is not in status");
                // The canonical form is a spec the device takes.
                let again = serde_json::json!({"cmd": "inject", "spec": spec}).to_string();
                let (ok, again) = parse(&reply_line(handler, &again).expect("reply"));
                assert!(ok, "{spec:?} refused when armed again: {again}");
                assert_eq!(again["spec"].as_str(), Some(spec), "not canonical");
            }
            ControlRequest::Clear => {
                assert!(ok, "{reply}");
                assert_eq!(armed(handler), Vec::<u64>::new(), "clear left injections");
            }
            ControlRequest::Inject { .. } | ControlRequest::Reset | ControlRequest::Trace { .. } => {}
        }
    }
    let _ = reply_line(handler, r#"{"cmd":"clear"}"#);
});
