//! When a UDP packet reached its socket, as the kernel stamped it (Linux's `SO_TIMESTAMPNS`),
//! rather than when the receiving thread got round to reading it.
//!
//! The test peer ([`crate::receiver`]) shares the machine's cores with the server it measures,
//! and decodes every frame on its own thread: while it decodes a 1080x1920 IDR, the next
//! frame's packets wait in the socket. Stamped on reading, those waits counted as gaps "on the
//! wire"; the kernel's stamp is the packet's arrival (on loopback, the sender's `sendto`).
//!
//! Written with `libc` (`recvmsg` and its control messages): `std` does not expose them; `nix`
//! wraps them but is not in the build, where `libc` already is, and this is the one call that
//! needs them. Elsewhere than Linux, or when the kernel gives no
//! stamp, a packet is stamped when it is read.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::time::Instant;

/// Asks the kernel to stamp each packet `socket` receives. Linux turns stamping on in deferred
/// work when the first socket asks for it, so the first packets may still be stamped when read.
pub fn enable(socket: &UdpSocket) -> io::Result<()> {
    imp::enable(socket)
}

/// Receives one packet (as `recv_from`, with the socket's read timeout) and when it arrived.
pub fn recv(socket: &UdpSocket, buf: &mut [u8]) -> io::Result<(usize, SocketAddr, Instant)> {
    imp::recv(socket, buf)
}

#[cfg(target_os = "linux")]
mod imp {
    use std::io;
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
    use std::os::fd::AsRawFd;
    use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

    pub fn enable(socket: &UdpSocket) -> io::Result<()> {
        let on: libc::c_int = 1;
        // SAFETY: an open socket, and an int option passed with its size.
        let r = unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_TIMESTAMPNS,
                (&on as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    pub fn recv(socket: &UdpSocket, buf: &mut [u8]) -> io::Result<(usize, SocketAddr, Instant)> {
        // SAFETY: all-zero is a valid sockaddr_storage and msghdr.
        let mut addr: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
        // u64s: control messages are aligned to the size of a pointer.
        let mut control = [0u64; 16];
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_name = (&mut addr as *mut libc::sockaddr_storage).cast();
        msg.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control) as _;
        // SAFETY: msg points at live buffers of the sizes it states.
        let n = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut msg, 0) };
        let read_at = Instant::now();
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut at = read_at;
        // SAFETY: the control buffer as recvmsg filled it; CMSG_* walk within msg_controllen.
        unsafe {
            let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
            while !cmsg.is_null() {
                if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_TIMESTAMPNS {
                    let ts = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg) as *const libc::timespec);
                    let stamp = UNIX_EPOCH + Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32);
                    // The stamp is on the wall clock; how long ago it was, on Instant's.
                    if let Ok(ago) = SystemTime::now().duration_since(stamp) {
                        at = read_at.checked_sub(ago).unwrap_or(read_at);
                    }
                }
                cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
            }
        }
        Ok((n as usize, socket_addr(&addr)?, at))
    }

    fn socket_addr(a: &libc::sockaddr_storage) -> io::Result<SocketAddr> {
        match a.ss_family as libc::c_int {
            libc::AF_INET => {
                // SAFETY: the family says it is a sockaddr_in.
                let v4 = unsafe { &*(a as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
                let ip = Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr));
                Ok(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(v4.sin_port))))
            }
            libc::AF_INET6 => {
                // SAFETY: the family says it is a sockaddr_in6.
                let v6 = unsafe { &*(a as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
                let ip = Ipv6Addr::from(v6.sin6_addr.s6_addr);
                Ok(SocketAddr::V6(SocketAddrV6::new(
                    ip,
                    u16::from_be(v6.sin6_port),
                    v6.sin6_flowinfo,
                    v6.sin6_scope_id,
                )))
            }
            f => Err(io::Error::other(format!("a packet from an address of family {f}"))),
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    use std::io;
    use std::net::{SocketAddr, UdpSocket};
    use std::time::Instant;

    pub fn enable(_: &UdpSocket) -> io::Result<()> {
        Ok(())
    }

    pub fn recv(socket: &UdpSocket, buf: &mut [u8]) -> io::Result<(usize, SocketAddr, Instant)> {
        let (n, from) = socket.recv_from(buf)?;
        Ok((n, from, Instant::now()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A packet read 200 ms after it was sent is stamped when it arrived, with its sender and
    /// bytes; an empty socket times out as `recv_from` does.
    #[test]
    fn a_packet_read_late_is_stamped_when_it_arrived() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        enable(&rx).unwrap();
        // The kernel turns its stamping on in deferred work once the first socket asks for it:
        // a packet received before then is stamped when it is read.
        std::thread::sleep(Duration::from_millis(100));
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let sent = Instant::now();
        tx.send_to(b"frame", rx.local_addr().unwrap()).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let mut buf = [0u8; 64];
        let (n, from, at) = recv(&rx, &mut buf).unwrap();
        assert_eq!((&buf[..n], from), (&b"frame"[..], tx.local_addr().unwrap()));
        let after = at.saturating_duration_since(sent);
        if cfg!(target_os = "linux") {
            assert!(after < Duration::from_millis(100), "stamped {after:?} after it was sent");
        }
        rx.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        let e = recv(&rx, &mut buf).unwrap_err();
        assert!(matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut), "{e}");
    }
}
