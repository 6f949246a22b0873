//! `cadence serve` as a process: it answers on the port it prints, and SIGTERM drains it to a
//! clean exit (the server's behaviour itself is tested in server/tests).

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn http_get(addr: &str, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn serve_answers_and_sigterm_stops_it_cleanly() {
    let temp = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_cadence"))
        .args(["serve", "--listen", "127.0.0.1:0", "--device", "cpu", "--temp-dir"])
        .arg(temp.path())
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut log = BufReader::new(child.stderr.take().unwrap());
    let mut addr = None;
    let mut line = String::new();
    while addr.is_none() && log.read_line(&mut line).unwrap() > 0 {
        addr = line.split("listening on http://").nth(1).map(|a| a.split_whitespace().next().unwrap().to_string());
        line.clear();
    }
    let addr = addr.expect("a 'listening on' line");
    assert!(http_get(&addr, "/healthz").starts_with("HTTP/1.1 200"));
    let t = Instant::now();
    while !http_get(&addr, "/readyz").starts_with("HTTP/1.1 200") {
        assert!(t.elapsed() < Duration::from_secs(60), "the engines did not load");
        std::thread::sleep(Duration::from_millis(100));
    }
    // SAFETY: kill(2) on our own child's pid has no memory effects.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let mut rest = String::new();
    log.read_to_string(&mut rest).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}\n{rest}");
    assert!(rest.contains("SIGTERM") && rest.contains("stopped"), "{rest}");
}
