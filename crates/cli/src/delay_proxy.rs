//! A TCP proxy on 127.0.0.1 that delays every byte by half a round-trip time each way: the
//! network between a browser and the worker, simulated for benchmarks.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A running proxy; it stops accepting when dropped (open connections finish on their own).
pub struct DelayProxy {
    addr: SocketAddr,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl DelayProxy {
    /// Forwards connections on a free local port to `upstream`, adding `rtt` to each round trip.
    pub fn start(upstream: SocketAddr, rtt: Duration) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        std::thread::spawn(move || {
            while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let _ = client.set_nonblocking(false);
                        if let Ok(server) = TcpStream::connect(upstream) {
                            relay(client, server, rtt / 2);
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    Err(_) => break,
                }
            }
        });
        Ok(Self { addr, stop })
    }

    /// `http://` base URL of the proxy.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Pumps both directions of one connection, each byte held back `one_way`.
fn relay(client: TcpStream, server: TcpStream, one_way: Duration) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    for (from, to) in [
        (client.try_clone(), server.try_clone()),
        (Ok(server), Ok(client)),
    ] {
        let (Ok(from), Ok(to)) = (from, to) else {
            return;
        };
        pump(from, to, one_way);
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream, delay: Duration) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx
                        .send((Instant::now() + delay, buf[..n].to_vec()))
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }
    });
    std::thread::spawn(move || {
        for (due, bytes) in rx {
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            if to.write_all(&bytes).is_err() {
                return;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_pass_unchanged_and_a_round_trip_takes_the_delay() {
        let echo = TcpListener::bind("127.0.0.1:0").expect("bind");
        let upstream = echo.local_addr().expect("addr");
        std::thread::spawn(move || {
            if let Ok((mut s, _)) = echo.accept() {
                let mut buf = [0u8; 64];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 || s.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        });
        let proxy = DelayProxy::start(upstream, Duration::from_millis(80)).expect("proxy");
        let mut s = TcpStream::connect(proxy.addr).expect("connect");
        let t = Instant::now();
        s.write_all(b"ping").expect("write");
        let mut got = [0u8; 4];
        s.read_exact(&mut got).expect("read");
        assert_eq!(&got, b"ping");
        let rtt = t.elapsed();
        assert!(rtt >= Duration::from_millis(80), "{rtt:?}");
    }
}
