//! The `--stats-file`: device counters as JSON, rewritten periodically and
//! once more at exit, always atomically so a reader (the test harness,
//! `watch cat`) never sees half a file.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tracing::{info, warn};

use crate::counters::CountersJson;

/// Writes `json` plus a newline to `path` atomically: into `<path>.tmp`,
/// then renamed over `path`. The temporary file is created anew, mode
/// 0600, never through a symlink: one planted at `<path>.tmp` is removed,
/// not followed, so it cannot redirect the write to another file.
pub fn write_stats_file(path: &Path, json: &str) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(".tmp");
    let tmp = PathBuf::from(tmp_name);
    {
        match std::fs::remove_file(&tmp) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let mut file = File::options()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        file.write_all(json.as_bytes())?;
        file.write_all(b"\n")?;
    }
    std::fs::rename(&tmp, path)
}

/// Rewrites the stats file on a thread every interval until stopped.
#[derive(Debug)]
pub struct StatsFileWriter {
    stop: mpsc::Sender<()>,
    thread: JoinHandle<()>,
    path: PathBuf,
}

impl StatsFileWriter {
    /// Writes the file once now (so a bad path fails at startup, naming
    /// `--stats-file`), then every `interval` on thread `thread_name`. With
    /// `log_every`, the counters are also logged at most that often, and
    /// only when they changed.
    pub fn start(
        path: PathBuf,
        interval: Duration,
        thread_name: String,
        counters: CountersJson,
        log_every: Option<Duration>,
    ) -> Result<Self> {
        write_stats_file(&path, &counters())
            .with_context(|| format!("--stats-file {}", path.display()))?;
        let (stop, stopped) = mpsc::channel::<()>();
        let file = path.clone();
        let span = tracing::Span::current();
        let thread = std::thread::Builder::new()
            .name(thread_name)
            .spawn(move || {
                let _span = span.enter();
                let mut last_logged = String::new();
                let mut last_log = Instant::now();
                loop {
                    match stopped.recv_timeout(interval) {
                        Err(RecvTimeoutError::Timeout) => {}
                        // Stopped, or the writer was dropped.
                        _ => return,
                    }
                    let json = counters();
                    if let Err(e) = write_stats_file(&file, &json) {
                        warn!(error = %e, file = %file.display(), "cannot write stats");
                    }
                    if let Some(every) = log_every {
                        if json != last_logged && last_log.elapsed() >= every {
                            info!(stats = %json, "counters");
                            last_logged = json;
                            last_log = Instant::now();
                        }
                    }
                }
            })
            .context("cannot start the stats thread")?;
        Ok(Self { stop, thread, path })
    }

    /// Stops the thread and writes `final_json`, the counters once the
    /// device is quiet, as the file's last contents.
    pub fn stop(self, final_json: &str) {
        // Either fails only if the thread is already gone, which is what
        // we want anyway.
        let _ = self.stop.send(());
        let _ = self.thread.join();
        if let Err(e) = write_stats_file(&self.path, final_json) {
            warn!(error = %e, file = %self.path.display(), "cannot write final stats");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    fn scratch_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("p2plab-server-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn start_writer(
        path: &Path,
        interval: Duration,
        counters: CountersJson,
    ) -> Result<StatsFileWriter> {
        StatsFileWriter::start(
            path.to_path_buf(),
            interval,
            "test-stats".into(),
            counters,
            None,
        )
    }

    /// Catches a stats writer that follows a symlink planted at its
    /// temporary path (clobbering the link's target) or leaves the file
    /// readable by others.
    #[test]
    fn the_stats_file_is_0600_and_a_planted_symlink_is_not_followed() {
        use std::os::unix::fs::PermissionsExt;
        let dir = scratch_dir("symlink");
        let victim = dir.join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let path = dir.join("stats.json");
        std::os::unix::fs::symlink(&victim, dir.join("stats.json.tmp")).unwrap();
        write_stats_file(&path, "{}").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{}\n");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// `dir/stats.json` holds `expected` and no temporary file is left.
    fn assert_stats_file_then_remove(dir: &Path, expected: &str) {
        let path = dir.join("stats.json");
        assert_eq!(std::fs::read_to_string(path).unwrap(), expected);
        assert!(!dir.join("stats.json.tmp").exists());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn stats_file_is_replaced_atomically() {
        let dir = scratch_dir("atomic");
        let path = dir.join("stats.json");
        write_stats_file(&path, "{\"a\":1}").unwrap();
        write_stats_file(&path, "{\"a\":2}").unwrap();
        assert_stats_file_then_remove(&dir, "{\"a\":2}\n");
    }

    #[test]
    fn writer_rewrites_periodically_and_writes_the_final_counters() {
        let dir = scratch_dir("writer");
        let path = dir.join("stats.json");
        let ticks = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&ticks);
        let counters: CountersJson =
            Arc::new(move || format!("{{\"n\":{}}}", counter.fetch_add(1, Ordering::Relaxed)));
        let writer = start_writer(&path, Duration::from_millis(10), counters).unwrap();
        // Written once before start returns.
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{\"n\":0}\n");
        let deadline = Instant::now() + Duration::from_secs(10);
        while ticks.load(Ordering::Relaxed) < 3 {
            assert!(
                Instant::now() < deadline,
                "the stats thread never rewrote the file"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        writer.stop("{\"final\":1}");
        assert_stats_file_then_remove(&dir, "{\"final\":1}\n");
    }

    #[test]
    fn a_missing_directory_fails_writes_and_the_writer_start() {
        let dir = scratch_dir("missing");
        let path = dir.join("no-such-dir").join("stats.json");
        assert!(write_stats_file(&path, "{}").is_err());
        let counters: CountersJson = Arc::new(|| "{}".to_string());
        let err = start_writer(&path, Duration::from_secs(1), counters)
            .err()
            .map(|e| format!("{e:#}"))
            .unwrap_or_default();
        assert!(err.starts_with("--stats-file "), "{err}");
        assert!(!path.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
