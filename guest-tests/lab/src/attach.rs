//! `--attach`: the console of a lab left up with `--keep`, on this terminal.
//! The terminal goes raw (keys reach the guest as typed) and Ctrl-] detaches,
//! leaving the lab running.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;

use anyhow::{Context, Result};

/// Ctrl-]: the detach key, as in telnet.
const DETACH: u8 = 0x1d;

/// Puts a terminal in raw mode and restores it when dropped.
struct RawTerminal {
    fd: i32,
    saved: libc::termios,
}

impl RawTerminal {
    fn enable(fd: i32) -> Option<Self> {
        // SAFETY: an all-zero termios is a valid value of this plain C struct.
        let mut saved: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: tcgetattr/tcsetattr on a terminal fd with valid pointers.
        unsafe {
            if libc::tcgetattr(fd, &mut saved) != 0 {
                return None;
            }
            let mut raw = saved;
            libc::cfmakeraw(&mut raw);
            if libc::tcsetattr(fd, libc::TCSANOW, &raw) != 0 {
                return None;
            }
        }
        Some(Self { fd, saved })
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        // SAFETY: restoring the attributes saved from the same fd.
        unsafe {
            libc::tcsetattr(self.fd, libc::TCSANOW, &self.saved);
        }
    }
}

/// Connects this terminal to `run_dir/console.sock` until Ctrl-] or until
/// the guest goes away.
pub fn attach(run_dir: &Path) -> Result<()> {
    let socket = run_dir.join("console.sock");
    let mut console = UnixStream::connect(&socket).with_context(|| {
        format!(
            "--attach: cannot connect to {} (is the lab still up?)",
            socket.display()
        )
    })?;
    eprintln!(
        "p2plab: attached to {}; Ctrl-] detaches (the lab stays up)",
        socket.display()
    );
    let stdin = std::io::stdin();
    let _raw = RawTerminal::enable(stdin.as_raw_fd());
    let mut reader = console.try_clone().context("cloning the console socket")?;
    // Guest output to our stdout on its own thread; keys on this one.
    let printer = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        let mut out = std::io::stdout();
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 || out.write_all(&buf[..n]).and_then(|()| out.flush()).is_err() {
                break;
            }
        }
    });
    let mut keys = [0u8; 256];
    let mut input = stdin.lock();
    loop {
        let n = input.read(&mut keys).context("reading the terminal")?;
        if n == 0 {
            break;
        }
        let typed = &keys[..n];
        let (send, detach) = match typed.iter().position(|&b| b == DETACH) {
            Some(at) => (&typed[..at], true),
            None => (typed, false),
        };
        if console.write_all(send).is_err() || detach {
            break;
        }
    }
    let _ = console.shutdown(std::net::Shutdown::Both);
    let _ = printer.join();
    eprintln!(
        "\r\np2plab: detached; the lab is still up (scripts/run-vm --stop {})",
        run_dir.display()
    );
    Ok(())
}
