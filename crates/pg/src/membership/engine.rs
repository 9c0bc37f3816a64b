//! Process-wide TCP endpoint: one listener and one acceptor thread shared by
//! every group in the process. Incoming connections name the group (by key)
//! and the connecting slot (see `handshake`); the acceptor asks the
//! registered group whether it expects that member, acknowledges or refuses
//! (the connector then retries), and hands admitted connections over. Links
//! can therefore arrive at any time: at construction, and later from
//! joining or replacement members. Each registration carries its group's
//! cluster secret (if any), which the admitted dialer must prove before the
//! link is handed over (see `handshake`).

use crate::error::PgError;
use crate::membership::admission;
use crate::membership::handshake::{self, Accepted, LinkHello};
use mooncake_common::limits::ConnPermit;
use mooncake_common::tcp_tune::{connect_data, tune_data_listener, tune_data_stream};
use mooncake_common::AuthKey;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// A connection accepted for a registered group.
pub(crate) struct Incoming {
    /// Slot the connector claims.
    pub(crate) slot: u32,
    /// The connector's member id.
    pub(crate) member_id: u64,
    /// The connected socket (preamble consumed, acknowledgement sent).
    pub(crate) stream: TcpStream,
}

/// What a registered group does with incoming links.
pub(crate) trait LinkHandler: Send + Sync {
    /// Whether the group expects member `member_id` at `slot` now.
    fn admit(&self, slot: u32, member_id: u64) -> bool;
    /// Takes over an admitted connection.
    fn attach(&self, inc: Incoming);
    /// An expected member at `slot` failed the authentication step.
    fn auth_failed(&self, slot: u32, reason: String);
}

struct Registration {
    member_id: u64,
    auth: Option<AuthKey>,
    handler: Arc<dyn LinkHandler>,
}

/// The process-wide listener.
pub(crate) struct Engine {
    port: u16,
    instance_id: u64,
    registry: Mutex<HashMap<u64, Registration>>,
}

static ENGINE: OnceLock<Arc<Engine>> = OnceLock::new();
static START: Mutex<()> = Mutex::new(());

/// Returns the process engine, starting it on first use.
pub(crate) fn engine() -> Result<Arc<Engine>, PgError> {
    if let Some(e) = ENGINE.get() {
        return Ok(e.clone());
    }
    let _g = START.lock();
    if let Some(e) = ENGINE.get() {
        return Ok(e.clone());
    }
    let listener =
        TcpListener::bind(("0.0.0.0", 0)).map_err(|e| PgError::io("bind PG listener", e))?;
    tune_data_listener(&listener);
    let port = listener
        .local_addr()
        .map_err(|e| PgError::io("PG listener address", e))?
        .port();
    let eng = Arc::new(Engine {
        port,
        instance_id: random_u64(),
        registry: Mutex::new(HashMap::new()),
    });
    let weak = Arc::downgrade(&eng);
    std::thread::Builder::new()
        .name("mcpg-accept".into())
        .spawn(move || accept_loop(listener, weak))
        .map_err(|e| PgError::io("spawn acceptor", e))?;
    let _ = ENGINE.set(eng.clone());
    Ok(eng)
}

impl Engine {
    /// TCP port peers connect to.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// Random id of this process's engine.
    pub(crate) fn instance_id(&self) -> u64 {
        self.instance_id
    }

    /// Registers a group member; incoming links for it go to `handler`
    /// once the dialer proved `auth` (the group's cluster secret, if any).
    pub(crate) fn register(
        &self,
        key: u64,
        member_id: u64,
        auth: Option<AuthKey>,
        handler: Arc<dyn LinkHandler>,
    ) -> Result<(), PgError> {
        let mut reg = self.registry.lock();
        if reg.contains_key(&key) {
            return Err(PgError::DuplicateGroup);
        }
        reg.insert(
            key,
            Registration {
                member_id,
                auth,
                handler,
            },
        );
        Ok(())
    }

    /// Removes a group registration.
    pub(crate) fn unregister(&self, key: u64, member_id: u64) {
        let mut reg = self.registry.lock();
        if reg.get(&key).map(|r| r.member_id) == Some(member_id) {
            reg.remove(&key);
        }
    }

    fn lookup(&self, key: u64) -> Option<(u64, Option<AuthKey>, Arc<dyn LinkHandler>)> {
        self.registry
            .lock()
            .get(&key)
            .map(|r| (r.member_id, r.auth.clone(), r.handler.clone()))
    }
}

fn accept_loop(listener: TcpListener, eng: std::sync::Weak<Engine>) {
    let alive = eng.clone();
    admission::serve(
        listener,
        "mcpg-link-acc",
        move || alive.strong_count() == 0,
        move |s, permit| {
            if let Some(eng) = eng.upgrade() {
                admit_link(&eng, s, permit);
            }
        },
    );
}

/// One incoming link: its handshake (on its own thread, see `admission`),
/// then the hand-over to the group that expects it.
fn admit_link(eng: &Engine, mut s: TcpStream, permit: ConnPermit) {
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let mut target: Option<Arc<dyn LinkHandler>> = None;
    let accepted = handshake::link_accept(&mut s, |h: &LinkHello| {
        let (me, auth, handler) = eng.lookup(h.key)?;
        if !handler.admit(h.slot, h.member_id) {
            return None;
        }
        target = Some(handler);
        Some((me, auth))
    });
    drop(permit);
    let (accepted, Some(handler)) = (accepted, target) else {
        return;
    };
    let hello = match accepted {
        Ok(Accepted::Admitted(hello)) => hello,
        Ok(Accepted::AuthFailed(hello, e)) => {
            handler.auth_failed(hello.slot, e.to_string());
            return;
        }
        Ok(Accepted::Refused) | Err(_) => return,
    };
    let _ = s.set_read_timeout(None);
    let _ = s.set_nodelay(true);
    tune_data_stream(&s);
    handler.attach(Incoming {
        slot: hello.slot,
        member_id: hello.member_id,
        stream: s,
    });
}

/// Connects to `endpoint` for group `key`, proving `auth` (the group's
/// cluster secret, if any); `Ok(None)` means the peer refused (it does not
/// expect us yet) and the caller should retry. An authentication refusal is
/// an error for which `handshake::is_auth_refusal` holds.
pub(crate) fn dial(
    endpoint: &str,
    hello: &LinkHello,
    expect_member: u64,
    auth: Option<&AuthKey>,
    timeout: Duration,
) -> Result<Option<TcpStream>, std::io::Error> {
    use std::net::ToSocketAddrs;
    let addr = endpoint
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| std::io::Error::other(format!("cannot resolve {endpoint}")))?;
    let mut s = connect_data(&addr, timeout.max(Duration::from_millis(10)))?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    if !handshake::link_dial(&mut s, hello, expect_member, auth)? {
        return Ok(None);
    }
    s.set_read_timeout(None)?;
    Ok(Some(s))
}

/// A random 64-bit value (seeded by the OS through `RandomState`).
pub(crate) fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static CTR: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(CTR.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.write_u32(std::process::id());
    h.finish()
}

/// Stable 64-bit FNV-1a hash (identical in every process).
pub(crate) fn stable_hash(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.as_bytes() {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}
