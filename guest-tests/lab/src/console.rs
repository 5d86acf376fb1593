//! Follows the guest console transcript that QEMU writes (chardev logfile)
//! and picks out the markers the guest init prints around an `--exec`
//! command.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// Printed by the guest init right before the command runs.
pub const EXEC_BEGIN: &str = "P2PLAB-EXEC-BEGIN";
/// Printed by the guest init when the interactive shell starts.
pub const READY: &str = "P2PLAB-READY";
/// Printed by the guest init with the command's exit status.
pub const EXEC_EXIT: &str = "P2PLAB-EXIT:";

/// Reads a growing file line by line.
#[derive(Debug)]
pub struct LogFollower {
    path: PathBuf,
    file: Option<File>,
    offset: u64,
    partial: Vec<u8>,
}

impl LogFollower {
    pub fn new(path: &Path) -> Self {
        Self {
            path: path.to_path_buf(),
            file: None,
            offset: 0,
            partial: Vec::new(),
        }
    }

    /// Complete lines appended since the last call, without line endings.
    pub fn poll_lines(&mut self) -> Vec<String> {
        if self.file.is_none() {
            self.file = File::open(&self.path).ok();
        }
        let Some(file) = self.file.as_mut() else {
            return Vec::new();
        };
        let mut chunk = Vec::new();
        if file.seek(SeekFrom::Start(self.offset)).is_err() || file.read_to_end(&mut chunk).is_err()
        {
            return Vec::new();
        }
        self.offset += chunk.len() as u64;
        self.partial.extend_from_slice(&chunk);
        let mut lines = Vec::new();
        while let Some(newline) = self.partial.iter().position(|&b| b == b'\n') {
            let raw: Vec<u8> = self.partial.drain(..=newline).collect();
            let text = String::from_utf8_lossy(&raw);
            lines.push(text.trim_end_matches(['\n', '\r']).to_owned());
        }
        lines
    }

    /// Whatever is left after the last newline (a prompt, say).
    pub fn take_partial(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.partial).into_owned();
        self.partial.clear();
        text
    }
}

/// Where a console line stands relative to the exec markers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecLine {
    /// Boot chatter before the command started.
    Boot(String),
    /// The marker that opens the command's output.
    Begin,
    /// A line the command (or the kernel, meanwhile) printed.
    Output(String),
    /// The closing marker with the command's exit status.
    Exit(i32),
}

/// Classifies console lines for an `--exec` run.
#[derive(Debug, Default)]
pub struct ExecTracker {
    started: bool,
    pub status: Option<i32>,
}

impl ExecTracker {
    /// Whether the command has begun (its opening marker was seen).
    pub fn started(&self) -> bool {
        self.started
    }

    pub fn classify(&mut self, line: &str) -> ExecLine {
        // The serial line may carry stray characters before a marker when
        // the kernel interleaves its own output; match anywhere in the line.
        if !self.started {
            if line.contains(EXEC_BEGIN) {
                self.started = true;
                return ExecLine::Begin;
            }
            return ExecLine::Boot(line.to_owned());
        }
        if self.status.is_none() {
            if let Some(pos) = line.find(EXEC_EXIT) {
                let digits: String = line[pos + EXEC_EXIT.len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_digit())
                    .collect();
                if let Ok(status) = digits.parse() {
                    self.status = Some(status);
                    return ExecLine::Exit(status);
                }
            }
        }
        ExecLine::Output(line.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn follows_a_growing_file_across_partial_lines() {
        let dir = std::env::temp_dir().join(format!("p2plab-follow-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("console.log");
        let mut follower = LogFollower::new(&path);
        assert!(
            follower.poll_lines().is_empty(),
            "missing file yields nothing"
        );
        let mut f = File::create(&path).unwrap();
        f.write_all(b"one\r\ntw").unwrap();
        assert_eq!(follower.poll_lines(), ["one"]);
        f.write_all(b"o\nthree\n").unwrap();
        assert_eq!(follower.poll_lines(), ["two", "three"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn tracks_markers_and_status() {
        let mut t = ExecTracker::default();
        assert_eq!(
            t.classify("[ 1.0] boot"),
            ExecLine::Boot("[ 1.0] boot".into())
        );
        assert_eq!(t.classify("P2PLAB-EXEC-BEGIN"), ExecLine::Begin);
        assert_eq!(t.classify("hello"), ExecLine::Output("hello".into()));
        assert_eq!(
            t.classify("P2PLAB-EXIT:x"),
            ExecLine::Output("P2PLAB-EXIT:x".into())
        );
        assert_eq!(t.classify("P2PLAB-EXIT:42"), ExecLine::Exit(42));
        assert_eq!(t.status, Some(42));
    }
}
