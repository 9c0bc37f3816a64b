//! The membership coordinator: one per process tree, hosted by the process
//! that hosts torch's rendezvous store (global rank 0), reached by every
//! process's agent over a control session. It owns each group's member
//! states and active set, serializes membership changes, and publishes them
//! as epoch-numbered views that every member applies at the same collective
//! sequence number (as upstream's coordinator does: rank and member states,
//! reconciliation, the three failure-handling modes).
//!
//! How a view change runs (two phases, so every member switches at one
//! point of the op stream):
//! 1. `Prepare(new view)` to every live participant. Each answers with the
//!    number of collectives it has issued (`next_seq`) and whether its links
//!    to every member of the new view are up, and starts no collective at or
//!    past that number until phase two.
//! 2. `Commit(view, from_seq = max next_seq)`: ops with seq >= from_seq run
//!    under the new view everywhere, earlier ones under the old one.
//!
//! Failures: a member whose control session closes is dead at once (its
//! process ended). Link reports (`Sync`, answers to `Query`) open a
//! reconciliation; the coordinator decides as soon as every active member
//! that nobody suspects has reported (without auto-deactivation: has asked
//! for the decision with `Sync`), or when the window closes, keeping the
//! largest set of members that are all connected to each other (ties keep
//! lower ranks). With auto-deactivation the others are dropped in a view
//! change and, if alive, fenced.
//!
//! Everything runs on one thread fed by a channel (sessions' reader threads
//! and the acceptor post events), so the state needs no locks. The state
//! machine (`state`, over each group's rules in `group` and the rank sets
//! of `rankset`) opens no socket and reads no clock: this module feeds it
//! inputs with the time and sends what it answers.

mod group;
mod rankset;
mod state;

use crate::error::PgError;
use crate::membership::admission;
use crate::membership::control::{self, ToCoord};
use crate::membership::handshake;
use group::Out;
use mooncake_common::limits::ConnPermit;
use mooncake_common::AuthKey;
use parking_lot::Mutex;
use state::{Input, State};
use std::collections::HashMap;
use std::io::BufReader;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

enum Event {
    Open(u64, TcpStream),
    Msg(u64, ToCoord),
    Closed(u64),
    Stop,
}

/// A running coordinator (stopped when dropped).
pub(crate) struct Coordinator {
    endpoint: String,
    port: u16,
    tx: parking_lot::Mutex<Sender<Event>>,
    stopped: Arc<AtomicBool>,
}

impl Coordinator {
    /// Starts a coordinator listening on all interfaces; peers reach it at
    /// `advertise:port`.
    pub(crate) fn start(advertise: &str) -> Result<Arc<Coordinator>, PgError> {
        let auth = PgError::load_auth()?;
        let listener = TcpListener::bind(("0.0.0.0", 0))
            .map_err(|e| PgError::io("bind the membership coordinator", e))?;
        let port = listener
            .local_addr()
            .map_err(|e| PgError::io("coordinator address", e))?
            .port();
        let (tx, rx) = channel::<Event>();
        let stopped = Arc::new(AtomicBool::new(false));
        let (acc_tx, acc_stop) = (tx.clone(), stopped.clone());
        std::thread::Builder::new()
            .name("mcpg-coord-acc".into())
            .spawn(move || accept_loop(listener, auth, acc_tx, acc_stop))
            .map_err(|e| PgError::io("spawn coordinator acceptor", e))?;
        std::thread::Builder::new()
            .name("mcpg-coord".into())
            .spawn(move || {
                let mut st = State::default();
                let mut sessions = Sessions::default();
                loop {
                    let wait = st
                        .next_wake()
                        .map(|w| w.saturating_duration_since(Instant::now()));
                    let ev = match wait {
                        Some(w) => rx.recv_timeout(w),
                        None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
                    };
                    match ev {
                        Ok(Event::Stop) | Err(RecvTimeoutError::Disconnected) => break,
                        Ok(Event::Open(id, s)) => sessions.open(id, s),
                        Ok(Event::Msg(id, msg)) => {
                            sessions.send_all(st.handle(Input::Msg(id, msg), Instant::now()))
                        }
                        Ok(Event::Closed(id)) => {
                            sessions.close(id);
                            sessions.send_all(st.handle(Input::Closed(id), Instant::now()));
                        }
                        Err(RecvTimeoutError::Timeout) => {}
                    }
                    sessions.send_all(st.tick(Instant::now()));
                }
                sessions.close_all();
            })
            .map_err(|e| PgError::io("spawn coordinator", e))?;
        Ok(Arc::new(Coordinator {
            endpoint: format!("{advertise}:{port}"),
            port,
            tx: parking_lot::Mutex::new(tx),
            stopped,
        }))
    }

    /// Where agents connect.
    pub(crate) fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Stops serving (idempotent); sessions see their connection close.
    pub(crate) fn stop(&self) {
        if self.stopped.swap(true, Ordering::AcqRel) {
            return;
        }
        let _ = self.tx.lock().send(Event::Stop);
        // Unblock the acceptor.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

impl Drop for Coordinator {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A membership coordinator hosted by this process (the bindings start one
/// in the process that hosts torch's rendezvous store). Stopped on drop.
pub struct CoordinatorHandle(Arc<Coordinator>);

impl CoordinatorHandle {
    /// Starts a coordinator; agents reach it at `advertise:port`.
    pub fn start(advertise: &str) -> Result<Self, PgError> {
        Coordinator::start(advertise).map(CoordinatorHandle)
    }

    /// Where agents connect (`host:port`).
    pub fn endpoint(&self) -> &str {
        self.0.endpoint()
    }

    /// Stops serving (idempotent).
    pub fn stop(&self) {
        self.0.stop()
    }
}

fn accept_loop(
    listener: TcpListener,
    auth: Option<AuthKey>,
    tx: Sender<Event>,
    stopped: Arc<AtomicBool>,
) {
    let tx = Mutex::new(tx);
    admission::serve(
        listener,
        "mcpg-coord-rd",
        move || stopped.load(Ordering::Acquire),
        move |s, permit| {
            let tx = tx.lock().clone();
            serve_session(s, permit, auth.as_ref(), tx);
        },
    );
}

/// One control session: its handshake (on its own thread, see
/// `admission`), then this thread reads the agent's messages until the
/// session closes.
fn serve_session(mut s: TcpStream, permit: ConnPermit, auth: Option<&AuthKey>, tx: Sender<Event>) {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let shook = handshake::control_accept(&mut s, auth);
    drop(permit);
    match shook {
        Ok(Some(_)) => {}
        Ok(None) => return,
        Err(e) => {
            if handshake::is_auth_refusal(&e) {
                let peer = s.peer_addr().map(|a| a.to_string()).unwrap_or_default();
                eprintln!("mooncake-pg: membership coordinator refused {peer}: {e}");
            }
            return;
        }
    }
    let _ = s.set_read_timeout(None);
    let _ = s.set_nodelay(true);
    let Ok(reader) = s.try_clone() else { return };
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    if tx.send(Event::Open(id, s)).is_err() {
        return;
    }
    let mut r = BufReader::new(reader);
    while let Ok(msg) = control::read_msg::<ToCoord>(&mut r) {
        if tx.send(Event::Msg(id, msg)).is_err() {
            return;
        }
    }
    let _ = tx.send(Event::Closed(id));
}

/// The writing halves of the open control sessions.
#[derive(Default)]
struct Sessions(HashMap<u64, TcpStream>);

impl Sessions {
    fn open(&mut self, id: u64, s: TcpStream) {
        let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
        self.0.insert(id, s);
    }

    fn close(&mut self, id: u64) {
        if let Some(w) = self.0.remove(&id) {
            let _ = w.shutdown(Shutdown::Both);
        }
    }

    /// Send each message to its session; a session whose write fails is
    /// closed (its reader then reports it closed).
    fn send_all(&mut self, out: Out) {
        for (sess, msg) in out {
            let failed = match self.0.get_mut(&sess) {
                Some(w) => control::write_msg(w, &msg).is_err(),
                None => false,
            };
            if failed {
                self.close(sess);
            }
        }
    }

    fn close_all(&mut self) {
        for (_, w) in self.0.drain() {
            let _ = w.shutdown(Shutdown::Both);
        }
    }
}
