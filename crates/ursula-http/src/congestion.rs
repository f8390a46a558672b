//! The TCP congestion control of client connections (`tcp_congestion` on the node,
//! `--tcp-congestion` on the gateway), set once on a listener: Linux gives every connection
//! accepted from it the listener's choice.
//!
//! CUBIC by default. It is the kernel's own default, so on most hosts nothing changes; the
//! setting exists because some hosts make BBR the system's, and BBR paces each connection
//! with a timer of its own wherever the device has no `fq` queueing discipline (loopback
//! never has one). A large answer written as fast as the socket takes it then costs a timer
//! per burst: on such a VM a node's cold catch-up reads took 2.5 times the CPU per byte they
//! take with CUBIC (docs/benchmarks.md, session 34).

use std::os::fd::AsFd;

/// The congestion control client connections get unless told otherwise.
pub const DEFAULT: &str = "cubic";

/// Whether `name` can be a congestion control's name: "" (the system's), or at most 15
/// letters, digits, `_` and `-` (the kernel's `TCP_CA_NAME_MAX` is 16 with its NUL).
pub fn check_name(name: &str) -> Result<(), String> {
    if name.len() < 16
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        Ok(())
    } else {
        Err(format!(
            "the congestion control must be \"\" (the system's) or a name such as \"cubic\" \
             or \"bbr\", got {name:?}"
        ))
    }
}

/// Sets `listener`'s congestion control to `name` ("" keeps the system's). A name the kernel
/// does not offer (a module not loaded, or one `net.ipv4.tcp_allowed_congestion_control`
/// does not allow an unprivileged process) is logged, and the system's stays.
pub fn set(listener: &impl AsFd, name: &str) {
    if name.is_empty() {
        return;
    }
    match rustix::net::sockopt::set_tcp_congestion(listener, name) {
        Ok(()) => tracing::debug!(tcp_congestion = name, "congestion control set"),
        Err(e) => tracing::warn!(
            error = %e,
            tcp_congestion = name,
            "could not set the congestion control; connections keep the system's"
        ),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]
mod tests {
    use super::*;
    use tokio::net::{TcpListener, TcpStream};

    /// The congestion control of a connection accepted on `listener`.
    async fn accepted(listener: &TcpListener) -> String {
        let addr = listener.local_addr().expect("addr");
        let (accepted, _client) = tokio::join!(listener.accept(), TcpStream::connect(addr));
        let (sock, _) = accepted.expect("accept");
        rustix::net::sockopt::tcp_congestion(&sock).expect("TCP_CONGESTION")
    }

    #[tokio::test]
    async fn accepted_connections_get_the_listeners_congestion_control() {
        // "reno" is built into every Linux kernel; no test host makes it its default.
        let configured = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        set(&configured, "reno");
        assert_eq!(accepted(&configured).await, "reno");
        let system = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        set(&system, "");
        assert_ne!(accepted(&system).await, "reno");
        // A name the kernel does not know leaves the system's, and the listener serves.
        let unknown = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        set(&unknown, "nosuchcc");
        assert_ne!(accepted(&unknown).await, "nosuchcc");
    }

    #[test]
    fn names_are_short_and_plain() {
        assert!(check_name("").is_ok());
        assert!(check_name("cubic").is_ok());
        assert!(check_name("bbr").is_ok());
        assert!(check_name("cubic; rm").is_err());
        assert!(check_name("sixteen-bytes-xx").is_err());
    }
}
