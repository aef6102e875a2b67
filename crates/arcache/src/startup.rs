//! Start-up that a signal can stop. Until the server is serving, the main
//! thread may sit in a handshake with a backing store, a log replay or a
//! device open, none of which look at a stop flag. A watcher thread obeys
//! SIGTERM/SIGINT there instead: it names the stage and ends the process.
//! Ending it mid-stage is safe because every stage is: a replay is redone
//! from the log at the next start, headers are written copy by copy, and
//! nothing has been acknowledged to a client yet. The watch therefore ends
//! ([`serving`]) before the first socket accepts a client: from there a
//! signal is a clean stop, which syncs what clients wrote.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

static STAGE: Mutex<&str> = Mutex::new("starting");

/// Names what start-up is doing now, for the message a signal prints.
pub fn stage(what: &'static str) {
    if let Ok(mut s) = STAGE.lock() {
        *s = what;
    }
    tracing::debug!("start-up: {what}");
}

fn current() -> &'static str {
    STAGE.lock().map_or("starting", |s| *s)
}

/// Exit status of a start-up ended by a signal.
pub const STOPPED_DURING_STARTUP: i32 = 1;

/// Whether a watch is on: the watcher reads it, and exits, under the lock,
/// so that no exit can follow [`serving`].
static WATCHING: Mutex<bool> = Mutex::new(false);

/// Ends the watch, if one is on, before clients can connect: a signal from
/// here on is left to the main loop's clean stop. Returns once no watcher
/// can end the process any more.
pub fn serving() {
    if let Ok(mut w) = WATCHING.lock() {
        *w = false;
    }
}

/// Watches `stop` (set by the signal handlers) until [`serving`] or
/// [`Watch::finish`].
pub struct Watch {
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watch {
    pub fn start(stop: Arc<AtomicBool>) -> Watch {
        if let Ok(mut w) = WATCHING.lock() {
            *w = true;
        }
        let thread = std::thread::Builder::new()
            .name("startup-watch".into())
            .spawn(move || loop {
                {
                    let Ok(watching) = WATCHING.lock() else { return };
                    if !*watching {
                        return;
                    }
                    if stop.load(Ordering::Relaxed) {
                        eprintln!("arcache: stopped by a signal while {}; nothing was served", current());
                        std::process::exit(STOPPED_DURING_STARTUP);
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            })
            .ok();
        Watch { thread }
    }

    /// Serving: from here the main loop answers signals with a clean stop.
    pub fn finish(mut self) {
        serving();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
