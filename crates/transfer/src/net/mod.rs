//! Socket I/O shared by the store's data path and the upstream-compatible
//! engine: scatter/gather sends and receives on raw descriptors
//! ([`sockio`]), the one pool of idle connections both keep to their peers
//! ([`pool`]), the connection side of their server loops ([`server`]), and
//! the one rule both split a TCP transfer by over parallel connections
//! (`streams`). Nothing here uses either face.

pub mod pool;
pub mod server;
pub mod sockio;
pub(crate) mod streams;

/// A connected loopback pair for tests: (client side, server side).
#[cfg(test)]
pub(crate) fn tcp_pair() -> (std::net::TcpStream, std::net::TcpStream) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("bind: {e}"));
    let c = std::net::TcpStream::connect(l.local_addr().unwrap_or_else(|e| panic!("{e}")))
        .unwrap_or_else(|e| panic!("connect: {e}"));
    let (s, _) = l.accept().unwrap_or_else(|e| panic!("accept: {e}"));
    (c, s)
}
