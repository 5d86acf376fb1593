//! Logging from `--log-level`, `--log-file` and `RUST_LOG`.

use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::Mutex;

use anyhow::{Context, Result};
use tracing_subscriber::EnvFilter;

use crate::args::ServerArgs;

/// Installs the global tracing subscriber: filter from `--log-level`, else
/// `RUST_LOG`, else "info"; output appended to `--log-file` (no colours),
/// else stderr. Thread names are logged because the server's work is
/// spread over named threads.
pub fn init_logging(args: &ServerArgs) -> Result<()> {
    let filter = log_filter(args.log_level.as_deref())?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_thread_names(true);
    match &args.log_file {
        Some(path) => {
            // Created 0600: the log holds guest and client activity. An
            // existing path is followed on purpose (`/dev/stderr`).
            let file = File::options()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(path)
                .with_context(|| format!("--log-file {}", path.display()))?;
            builder
                .with_writer(Mutex::new(file))
                .with_ansi(false)
                .init();
        }
        None => builder.with_writer(std::io::stderr).init(),
    }
    Ok(())
}

fn log_filter(log_level: Option<&str>) -> Result<EnvFilter> {
    match log_level {
        Some(level) => EnvFilter::try_new(level)
            .with_context(|| format!("--log-level: invalid filter {level:?}")),
        None => Ok(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_log_level_names_the_flag() {
        let err = log_filter(Some("nope=[")).unwrap_err();
        assert!(format!("{err:#}").starts_with("--log-level: invalid filter \"nope=[\""));
    }

    #[test]
    fn directives_are_accepted() {
        assert!(log_filter(Some("debug")).is_ok());
        assert!(log_filter(Some("info,p2plab_nvme=trace")).is_ok());
    }
}
