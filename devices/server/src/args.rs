//! The flags every device server takes.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use p2plab_vfio_user::ServerConfig;

/// Where the [`ServerArgs`] flags after `--socket` sit in `--help`: after
/// the binary's own flags (numbered 0, 1, 2... in declaration order) and
/// before `--help`/`--version` (which clap numbers 999), as they were
/// listed before these flags were shared.
const AFTER_DEVICE_FLAGS: usize = 900;

/// Flags every device server takes. Flatten into a binary's `Args` with
/// `#[command(flatten)] server: ServerArgs` as its first field. `--socket`
/// is listed first in `--help`, the rest after the device's own flags.
/// A binary can reword a help text with `#[command(mut_arg("stats_file",
/// |a| a.help("...")))]`.
#[derive(Debug, Clone, Args)]
pub struct ServerArgs {
    /// Unix socket to listen on (QEMU's vfio-user-pci connects here).
    #[arg(long, value_name = "PATH", display_order = 0)]
    pub socket: PathBuf,

    /// Log filter (error, warn, info, debug, trace, or tracing directives).
    /// Without it RUST_LOG is used, else "info".
    #[arg(long, value_name = "FILTER", display_order = AFTER_DEVICE_FLAGS)]
    pub log_level: Option<String>,

    /// Append the log to this file instead of stderr.
    #[arg(long, value_name = "PATH", display_order = AFTER_DEVICE_FLAGS + 1)]
    pub log_file: Option<PathBuf>,

    /// Exit when the client disconnects instead of waiting for the next one.
    #[arg(long, display_order = AFTER_DEVICE_FLAGS + 2)]
    pub exit_on_disconnect: bool,

    /// Rewrite device counters as JSON to this file periodically and at exit.
    #[arg(long, value_name = "PATH", display_order = AFTER_DEVICE_FLAGS + 3)]
    pub stats_file: Option<PathBuf>,

    /// How often to rewrite the stats file, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 1000, display_order = AFTER_DEVICE_FLAGS + 4)]
    pub stats_interval_ms: u64,

    /// Permissions of the socket file, in octal, applied whatever the umask.
    /// The default lets only this uid connect; e.g. 0660 opens it to the
    /// socket's group (whose uids must still be allowed with --allow-uid).
    #[arg(long, value_name = "MODE", default_value = "0600", value_parser = parse_mode,
          display_order = AFTER_DEVICE_FLAGS + 5)]
    pub socket_mode: u32,

    /// Also serve clients running as this uid (repeat for more). Clients of
    /// any other uid than the server's own are disconnected at once.
    #[arg(long = "allow-uid", value_name = "UID", display_order = AFTER_DEVICE_FLAGS + 6)]
    pub allow_uid: Vec<u32>,

    /// Append every message the client sends, with a description of its
    /// fds, to FILE, in the input format of the vfio_user_session fuzz
    /// target (seed corpora are recorded this way).
    #[arg(long, value_name = "FILE", display_order = AFTER_DEVICE_FLAGS + 7)]
    pub record_session: Option<PathBuf>,

    /// Control socket for p2plab-ctl (status, inject, clear, reset), mode
    /// 0600. Default: the --socket path with the extension .ctl.
    #[arg(long, value_name = "PATH", display_order = AFTER_DEVICE_FLAGS + 8)]
    pub control_socket: Option<PathBuf>,

    /// Record the decoded trace from the start (`p2plab-ctl SOCKET trace
    /// on|off` switches it at run time).
    #[arg(long, display_order = AFTER_DEVICE_FLAGS + 9)]
    pub trace: bool,

    /// Where the trace goes, as JSON lines. Default: the --socket path
    /// with the extension .trace.jsonl.
    #[arg(long, value_name = "PATH", display_order = AFTER_DEVICE_FLAGS + 10)]
    pub trace_file: Option<PathBuf>,

    /// Most client memory ranges mapped with an fd at once (1..=65535);
    /// more DMA_MAPs get ENOSPC. Without a vIOMMU QEMU sends a handful
    /// (guest RAM around its holes). Behind a vIOMMU every 4 KiB page the
    /// guest maps for DMA is one such range, so the limit must cover the
    /// pages of all I/O in flight (a single 1 MiB request is 256). Each
    /// range keeps one file open, so it must also fit RLIMIT_NOFILE.
    #[arg(long, value_name = "N", default_value_t = 256,
          value_parser = clap::value_parser!(u32).range(1..=65535),
          display_order = AFTER_DEVICE_FLAGS + 11)]
    pub max_fd_dma_maps: u32,

    /// Zero-copy DMA into other p2plab servers' BARs (`on`, `off`): share
    /// BAR memory with the servers whose sockets are in `peers/` beside
    /// --socket. With `off`, DMA to peers goes through QEMU by message.
    #[arg(long, value_name = "on|off", default_value = "on", value_parser = parse_on_off,
          action = clap::ArgAction::Set,
          display_order = AFTER_DEVICE_FLAGS + 12)]
    pub peer_path: bool,

    /// The peers whose BARs this device's DMA reaches at their bus
    /// addresses: `all` (no IOMMU: the root complex routes any peer
    /// address), `none`, or server ids (`gpu0,nvme1`). Behind a vIOMMU,
    /// the peers below the same PCIe switch with no ACS redirect on the
    /// path: a switch routes those directly, every other address goes to
    /// the IOMMU (an IOVA). The lab derives it from the topology.
    #[arg(long, value_name = "all|none|ID,..", default_value = "all",
          value_parser = p2plab_peer::DirectPeers::parse,
          display_order = AFTER_DEVICE_FLAGS + 15)]
    pub direct_peers: p2plab_peer::DirectPeers,
    /// Also open a control socket for the guest at PATH (mode 0600), for
    /// QEMU to connect a virtio-serial port to (`scripts/run-vm
    /// --guest-control`). Off unless given. The guest may ask for status,
    /// inject, clear and trace, but not reset, nor clear what the host
    /// armed or switch off a trace the host switched on.
    #[arg(long, value_name = "PATH", display_order = AFTER_DEVICE_FLAGS + 13)]
    pub guest_control_socket: Option<PathBuf>,

    /// Cap on the trace file's size (what it held before counts): at the
    /// cap recording stops, a last line says why, and `trace` status
    /// reports `stopped_at_cap`. A size like 256M, 1G, 65536; at least 1K.
    #[arg(long, value_name = "BYTES", default_value = "256M", value_parser = parse_trace_cap,
          display_order = AFTER_DEVICE_FLAGS + 14)]
    pub trace_max_bytes: u64,
}

/// A byte count (digits with an optional binary suffix K, M, G, T) of at
/// least [`p2plab_trace::MIN_MAX_BYTES`].
fn parse_trace_cap(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, suffix) = t.split_at(digits_end);
    let shift = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" => 10,
        "m" | "mib" => 20,
        "g" | "gib" => 30,
        "t" | "tib" => 40,
        _ => return Err(format!("{text:?} is not a size like 256M, 1G or 65536")),
    };
    let bytes = digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .ok_or_else(|| format!("{text:?} is not a size like 256M, 1G or 65536"))?;
    if bytes < p2plab_trace::MIN_MAX_BYTES {
        return Err(format!(
            "{text:?} is below the smallest trace cap, {} bytes",
            p2plab_trace::MIN_MAX_BYTES
        ));
    }
    Ok(bytes)
}

/// `on` or `off`, naming the bad value otherwise.
fn parse_on_off(text: &str) -> Result<bool, String> {
    match text {
        "on" => Ok(true),
        "off" => Ok(false),
        other => Err(format!("{other:?} is neither on nor off")),
    }
}

/// An octal file mode of at most 0777 ("0600", "600" or "0o600").
fn parse_mode(text: &str) -> Result<u32, String> {
    let digits = text.strip_prefix("0o").unwrap_or(text);
    let mode = u32::from_str_radix(digits, 8)
        .map_err(|_| format!("{text:?} is not an octal mode like 0600"))?;
    if mode > 0o777 {
        return Err(format!("{text:?} has bits beyond 0777"));
    }
    Ok(mode)
}

impl ServerArgs {
    /// The transport's configuration these flags ask for.
    pub fn server_config(&self) -> ServerConfig {
        let mut config = ServerConfig::new(&self.socket);
        config.exit_on_disconnect = self.exit_on_disconnect;
        config.socket_mode = self.socket_mode;
        config.allowed_uids = self.allow_uid.clone();
        config.record_session = self.record_session.clone();
        config.max_fd_dma_maps = self.max_fd_dma_maps;
        config
    }

    /// Where the control socket goes (`--control-socket`, else next to
    /// `--socket`).
    pub fn control_path(&self) -> PathBuf {
        self.control_socket
            .clone()
            .unwrap_or_else(|| crate::control::default_control_path(&self.socket))
    }

    /// Where the trace goes (`--trace-file`, else next to `--socket`).
    pub fn trace_path(&self) -> PathBuf {
        self.trace_file
            .clone()
            .unwrap_or_else(|| p2plab_trace::default_trace_path(&self.socket))
    }

    /// Where the control sockets go: the host's, and the guest's if
    /// `--guest-control-socket` asks for one.
    pub fn control_sockets(&self) -> crate::control::ControlSockets {
        crate::control::ControlSockets {
            host: self.control_path(),
            guest: self.guest_control_socket.clone(),
        }
    }

    /// Points `tracer` at [`trace_path`](Self::trace_path), named after
    /// the socket, capped at `--trace-max-bytes`, and switches it on with
    /// `--trace`.
    pub fn configure_tracer(&self, tracer: &p2plab_trace::Tracer) -> anyhow::Result<()> {
        let path = self.trace_path();
        tracer
            .set_max_bytes(self.trace_max_bytes)
            .map_err(|e| anyhow::anyhow!("--trace-max-bytes: {e}"))?;
        tracer.configure(&path, &p2plab_trace::device_name(&self.socket));
        if self.trace {
            tracer
                .enable()
                .map_err(|e| anyhow::anyhow!("--trace-file {}: {e}", path.display()))?;
        }
        Ok(())
    }

    /// Starts the peer registry beside `--socket` (unless `--peer-path
    /// off`), sharing `exports` and placing peers' BARs in `dma`.
    pub fn start_peers(
        &self,
        dma: &p2plab_vfio_user::DmaSpace,
        exports: Vec<p2plab_peer::Export>,
    ) -> anyhow::Result<Option<std::sync::Arc<p2plab_peer::PeerRegistry>>> {
        if !self.peer_path {
            tracing::info!("peer path off: DMA to peer BARs goes through the client");
            return Ok(None);
        }
        let mut config = p2plab_peer::PeerConfig::beside(&self.socket);
        config.direct = self.direct_peers.clone();
        tracing::info!(direct_peers = %config.direct, "peer routing: these peers' BARs are reached at their bus addresses");
        let dir = config.dir.clone();
        let registry =
            p2plab_peer::PeerRegistry::start(config, dma.clone(), exports).map_err(|e| {
                anyhow::anyhow!("--peer-path on: peer socket in {}: {e}", dir.display())
            })?;
        Ok(Some(std::sync::Arc::new(registry)))
    }

    /// `--stats-interval-ms`, at least 10 ms so a typo cannot turn the
    /// stats thread into a busy loop rewriting the file.
    pub fn stats_interval(&self) -> Duration {
        Duration::from_millis(self.stats_interval_ms.max(10))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    /// A device binary's `Args` as the binaries declare theirs.
    #[derive(Debug, Parser)]
    #[command(name = "dev")]
    struct DeviceArgs {
        #[command(flatten)]
        server: ServerArgs,
        /// A device flag.
        #[arg(long, default_value_t = 7)]
        knob: u32,
        /// Another device flag.
        #[arg(long)]
        other: Option<String>,
    }

    #[test]
    fn parses_the_common_flags_and_defaults() {
        let args = DeviceArgs::try_parse_from([
            "dev",
            "--socket",
            "/run/x.sock",
            "--knob",
            "3",
            "--log-level",
            "debug",
            "--log-file",
            "/tmp/log",
            "--exit-on-disconnect",
            "--stats-file",
            "/tmp/stats.json",
            "--stats-interval-ms",
            "250",
            "--socket-mode",
            "0660",
            "--allow-uid",
            "1000",
            "--allow-uid",
            "0",
            "--record-session",
            "/tmp/rec",
        ])
        .unwrap();
        assert_eq!(args.knob, 3);
        let s = &args.server;
        assert_eq!(s.socket, PathBuf::from("/run/x.sock"));
        assert_eq!(s.log_level.as_deref(), Some("debug"));
        assert_eq!(s.log_file, Some(PathBuf::from("/tmp/log")));
        assert!(s.exit_on_disconnect);
        assert_eq!(s.stats_file, Some(PathBuf::from("/tmp/stats.json")));
        assert_eq!(s.stats_interval(), Duration::from_millis(250));
        assert!(s.server_config().exit_on_disconnect);
        let config = s.server_config();
        assert_eq!(config.socket_mode, 0o660);
        assert_eq!(config.allowed_uids, vec![1000, 0]);
        assert_eq!(config.record_session, Some(PathBuf::from("/tmp/rec")));

        let bare = DeviceArgs::try_parse_from(["dev", "--socket", "s"]).unwrap();
        assert_eq!(bare.server.log_level, None);
        assert_eq!(bare.server.log_file, None);
        assert!(!bare.server.exit_on_disconnect);
        assert_eq!(bare.server.stats_file, None);
        assert_eq!(bare.server.stats_interval_ms, 1000);
        let config = bare.server.server_config();
        assert_eq!(config.socket_mode, 0o600, "only our uid by default");
        assert!(config.allowed_uids.is_empty());
        assert_eq!(config.record_session, None);
        assert_eq!(config.max_fd_dma_maps, 256);
    }

    /// Catches a --max-fd-dma-maps that does not reach the transport, or
    /// that accepts a value the transport would refuse at startup.
    #[test]
    fn max_fd_dma_maps_reaches_the_transport_within_its_range() {
        let parse = |n: &str| {
            DeviceArgs::try_parse_from(["dev", "--socket", "s", "--max-fd-dma-maps", n])
                .map(|a| a.server.server_config().max_fd_dma_maps)
        };
        assert_eq!(parse("4096").unwrap(), 4096);
        assert_eq!(parse("65535").unwrap(), 65535);
        assert!(parse("0").is_err());
        assert!(parse("65536").is_err());
        assert!(parse("many").is_err());
    }

    /// Catches a mode flag that takes decimal, or a mode wider than 0777.
    #[test]
    fn socket_mode_is_octal_and_bounded() {
        let mode = |m: &str| {
            DeviceArgs::try_parse_from(["dev", "--socket", "s", "--socket-mode", m])
                .map(|a| a.server.socket_mode)
        };
        assert_eq!(mode("600").unwrap(), 0o600);
        assert_eq!(mode("0o666").unwrap(), 0o666);
        let err = mode("0800").unwrap_err().to_string();
        assert!(err.contains("--socket-mode"), "{err}");
        assert!(mode("4755").is_err(), "setuid bits on a socket");
    }

    #[test]
    fn socket_is_required() {
        let err = DeviceArgs::try_parse_from(["dev", "--knob", "1"]).unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::MissingRequiredArgument);
        assert!(err.to_string().contains("--socket"));
    }

    /// Catches a peer path that is off by default, or a bad value that is
    /// taken silently or refused without naming it.
    #[test]
    fn peer_path_is_on_by_default_and_names_a_bad_value() {
        let args = DeviceArgs::try_parse_from(["dev", "--socket", "s"]).unwrap();
        assert!(args.server.peer_path);
        let args =
            DeviceArgs::try_parse_from(["dev", "--socket", "s", "--peer-path", "off"]).unwrap();
        assert!(!args.server.peer_path);
        let err = DeviceArgs::try_parse_from(["dev", "--socket", "s", "--peer-path", "maybe"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--peer-path") && err.contains("maybe"),
            "{err}"
        );
    }

    /// Catches: a routing table that does not reach the peer registry's
    /// parser (a bad value taken silently, or refused without naming the
    /// flag), or a default other than `all` (every topology without a
    /// vIOMMU relies on it).
    #[test]
    fn direct_peers_defaults_to_all_and_names_a_bad_value() {
        let parse = |v: &str| {
            DeviceArgs::try_parse_from(["dev", "--socket", "s", "--direct-peers", v])
                .map(|a| a.server.direct_peers)
        };
        let bare = DeviceArgs::try_parse_from(["dev", "--socket", "s"]).unwrap();
        assert_eq!(bare.server.direct_peers, p2plab_peer::DirectPeers::All);
        let table = parse("nvme1,gpu0").unwrap();
        assert_eq!(table.route_to("gpu0"), p2plab_peer::Route::BusAddress);
        assert_eq!(table.route_to("nvme2"), p2plab_peer::Route::Translated);
        assert_eq!(
            parse("none").unwrap().route_to("gpu0"),
            p2plab_peer::Route::Translated
        );
        let err = parse("gpu0,,x").unwrap_err().to_string();
        assert!(
            err.contains("--direct-peers") && err.contains("gpu0,,x"),
            "{err}"
        );
    }

    /// Catches a trace cap flag that does not reach the tracer, takes a
    /// cap too small for a header, or has no default (an unbounded file).
    #[test]
    fn trace_max_bytes_reaches_the_tracer_with_a_floor() {
        let parse = |extra: &[&str]| {
            let mut argv = vec!["dev", "--socket", "/tmp/p2plab-args-x.sock"];
            argv.extend_from_slice(extra);
            DeviceArgs::try_parse_from(argv).map(|a| a.server)
        };
        assert_eq!(parse(&[]).unwrap().trace_max_bytes, 256 << 20);
        assert_eq!(
            parse(&["--trace-max-bytes", "4K"]).unwrap().trace_max_bytes,
            4096
        );
        assert_eq!(
            parse(&["--trace-max-bytes", "65536"])
                .unwrap()
                .trace_max_bytes,
            65536
        );
        for bad in ["512", "lots", "1Q", "99999999999T"] {
            let err = parse(&["--trace-max-bytes", bad]).unwrap_err().to_string();
            assert!(err.contains("--trace-max-bytes"), "{bad}: {err}");
        }
        let args = parse(&["--trace-max-bytes", "2K"]).unwrap();
        let tracer = p2plab_trace::Tracer::new();
        args.configure_tracer(&tracer).unwrap();
        assert_eq!(tracer.status().max_bytes, 2048);
    }

    /// Catches a guest control socket that is on by default, or whose
    /// path does not reach the control server.
    #[test]
    fn the_guest_control_socket_is_off_unless_given() {
        let bare = DeviceArgs::try_parse_from(["dev", "--socket", "/r/nvme0.sock"]).unwrap();
        let sockets = bare.server.control_sockets();
        assert_eq!(sockets.host, PathBuf::from("/r/nvme0.ctl"));
        assert_eq!(sockets.guest, None);
        let on = DeviceArgs::try_parse_from([
            "dev",
            "--socket",
            "/r/nvme0.sock",
            "--guest-control-socket",
            "/r/nvme0.guest.ctl",
        ])
        .unwrap();
        assert_eq!(
            on.server.control_sockets().guest,
            Some(PathBuf::from("/r/nvme0.guest.ctl"))
        );
    }

    #[test]
    fn stats_interval_has_a_floor() {
        let args = DeviceArgs::try_parse_from(["dev", "--socket", "s", "--stats-interval-ms", "0"])
            .unwrap();
        assert_eq!(args.server.stats_interval(), Duration::from_millis(10));
    }

    #[test]
    fn help_lists_socket_first_and_the_rest_after_device_flags() {
        let help = DeviceArgs::command().render_help().to_string();
        let order: Vec<usize> = [
            "--socket",
            "--knob",
            "--other",
            "--log-level",
            "--log-file",
            "--exit-on-disconnect",
            "--stats-file",
            "--stats-interval-ms",
            "--socket-mode",
            "--allow-uid",
            "--record-session",
            "--control-socket",
            "--trace",
            "--trace-file",
            "--guest-control-socket",
            "--trace-max-bytes",
            "--help",
        ]
        .iter()
        .map(|flag| {
            help.find(flag)
                .unwrap_or_else(|| panic!("{flag} missing: {help}"))
        })
        .collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{help}");
    }
}
