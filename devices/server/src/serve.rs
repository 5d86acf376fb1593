//! The wiring every server binary shares, after it has built its PCI
//! function: peer registry (exports and BAR placement), tracer, `--inject`
//! flags, control socket, the transport, stats, and the shutdown order.

use std::sync::Arc;

use anyhow::{anyhow, Result};
use p2plab_kit::{HoleHook, PlacementHook, ServedDevice};
use p2plab_pci::PciFunction;
use p2plab_peer::Export;
use p2plab_vfio_user::{DmaSpace, Server};
use tracing::info;

use crate::args::ServerArgs;
use crate::control::{Channel, ControlRequest, ControlServer, Dispatcher};
use crate::device::{DeviceHandler, DeviceStats};
use crate::process::Launch;

/// Serves `function` until shutdown. Its DMA goes through `dma` (the
/// space the function was built on); `injections` are `--inject` specs,
/// armed before the guest can reach the device.
///
/// The order: share the device's peer BAR and follow where it decodes;
/// point the tracer at its file; arm the injections; open the control
/// sockets (the guest's too with `--guest-control-socket`); start the
/// stats file; serve. Then, once the transport returns: the model's
/// shutdown step, drop the model (its engines stop), close the peers
/// (they drop their windows on our BAR), and write the final stats.
pub fn serve_device<M: ServedDevice>(
    args: &ServerArgs,
    launch: Launch<'_>,
    dma: DmaSpace,
    mut function: PciFunction<M>,
    injections: &[String],
) -> Result<()> {
    let name = launch.process_name();
    let control = function.model().control();
    let exports: Vec<Export> = function
        .model()
        .peer_bar()
        .map_err(|e| anyhow!("cannot share the peer BAR's memory: {e}"))?
        .map(|bar| Export {
            bar: bar.bar,
            fd: bar.fd,
            size: bar.size,
        })
        .into_iter()
        .collect();
    let peers = args.start_peers(&dma, exports)?;
    if let (Some(peers), Some(bar)) = (&peers, M::PEER_BAR) {
        let placed = Arc::clone(peers);
        function
            .model_mut()
            .on_peer_bar_placement(PlacementHook::new(move |addr| {
                placed.set_placement(bar, addr)
            }));
        // Peers read our BAR through their mappings where they know its
        // pages are there: they must hear of a punch before and after it.
        let punched = Arc::clone(peers);
        function
            .model_mut()
            .on_peer_bar_holes(HoleHook::new(move || punched.holes_changing(bar)));
    }
    args.configure_tracer(control.tracer())?;
    let stats = Arc::new(DeviceStats::new(
        Arc::clone(&control),
        dma.clone(),
        peers.clone(),
        M::PEER_BAR,
    ));
    let dispatcher = Arc::new(Dispatcher::new(Arc::new(DeviceHandler(Arc::clone(&stats)))));
    // As the host's: the guest channel's `clear` leaves them alone.
    for spec in injections {
        let inject = ControlRequest::Inject { spec: spec.clone() };
        dispatcher
            .answer(Channel::Host, &inject)
            .map_err(|e| anyhow!("--inject {spec}: {e}"))?;
    }
    let sockets = args.control_sockets();
    let _control = ControlServer::start(&sockets, dispatcher).map_err(|e| {
        let guest = sockets
            .guest
            .as_ref()
            .map(|g| format!(" / --guest-control-socket {}", g.display()))
            .unwrap_or_default();
        anyhow!("--control-socket {}{guest}: {e}", sockets.host.display())
    })?;

    let server = Server::new(args.server_config(), dma)?;
    let running = launch.start(&server, Arc::new(move || stats.json()))?;
    let result = server.run(&mut function);
    function.model().stopping();
    drop(function);
    if let Some(peers) = &peers {
        peers.close();
    }
    let json = running.finish();
    info!(stats = %json, "{name} exiting");
    result?;
    Ok(())
}
