//! The few HTTP/1.1 requests `serve` answers, and its answers to bad ones.
//! Every reply closes its connection.
use std::{
    fmt::Write as _,
    io::{Read as _, Write as _},
    net::TcpStream,
    time::Duration,
};

use super::profiles::{kind_of, NAMES};
use crate::export::pprof::Kind;

/// The longest window `?seconds=N` may ask for.
pub const MAX_WINDOW_S: u64 = 3600;

/// What a request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    Metrics,
    Healthz,
    /// `/debug/pprof/`: the profiles' names.
    Index,
    /// `/debug/pprof/<name>`, for the next `seconds` or since the start.
    Profile {
        kind: Kind,
        seconds: Option<u64>,
    },
}

/// An answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn text(status: u16, body: impl Into<String>) -> Self {
        Self { status, content_type: "text/plain; charset=utf-8", body: body.into().into_bytes() }
    }

    fn reason(&self) -> &'static str {
        match self.status {
            200 => "OK",
            400 => "Bad Request",
            404 => "Not Found",
            405 => "Method Not Allowed",
            503 => "Service Unavailable",
            _ => "Internal Server Error",
        }
    }
}

/// The index of `/debug/pprof/`: one profile a line, its name and what it weighs.
pub fn index() -> String {
    let mut t = String::from(
        "vmtrace profiles (gzipped pprof; cumulative since serve started, or ?seconds=N for the next N seconds; resident: held now):\n",
    );
    for (name, what) in NAMES {
        let _ = writeln!(t, "/debug/pprof/{name}\t{what}");
    }
    t
}

fn unknown_profile(name: &str) -> Reply {
    let names: Vec<&str> = NAMES.iter().map(|n| n.0).collect();
    Reply::text(404, format!("no profile named {name:?}; the profiles are: {}\n", names.join(", ")))
}

/// The route of a request line's method and target, or the answer to a bad one.
pub fn route(method: &str, target: &str) -> Result<Route, Reply> {
    if method != "GET" && method != "HEAD" {
        return Err(Reply::text(405, format!("{method} is not served: only GET\n")));
    }
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    match path {
        "/metrics" => return Ok(Route::Metrics),
        "/healthz" => return Ok(Route::Healthz),
        "/debug/pprof" | "/debug/pprof/" => return Ok(Route::Index),
        _ => {}
    }
    let Some(name) = path.strip_prefix("/debug/pprof/") else {
        return Err(Reply::text(404, format!("nothing at {path}: try /metrics, /healthz or /debug/pprof/\n")));
    };
    let kind = kind_of(name).ok_or_else(|| unknown_profile(name))?;
    let mut seconds = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if k != "seconds" {
            continue;
        }
        let n: u64 = v.parse().map_err(|_| {
            Reply::text(400, format!("seconds={v:?} is not a whole number of seconds: ask for e.g. ?seconds=15\n"))
        })?;
        if n == 0 || n > MAX_WINDOW_S {
            return Err(Reply::text(
                400,
                format!(
                    "seconds={n} is out of range: a window is 1 to {MAX_WINDOW_S} seconds (leave seconds out for everything since the start)\n"
                ),
            ));
        }
        seconds = Some(n);
    }
    if seconds.is_some() && super::profiles::is_gauge(kind) {
        return Err(Reply::text(
            400,
            format!(
                "{} is what the running processes hold now, not a count over a window: ask without ?seconds\n",
                kind.stem
            ),
        ));
    }
    Ok(Route::Profile { kind, seconds })
}

/// Reads a request's head (up to 8 KiB): its method and target.
pub fn read_request(stream: &mut TcpStream) -> Option<(String, String)> {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 2048];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 8192 {
        let n = stream.read(&mut chunk).ok().filter(|n| *n > 0)?;
        buf.extend_from_slice(&chunk[..n]);
    }
    let head = String::from_utf8_lossy(&buf);
    let mut first = head.lines().next()?.split_whitespace();
    Some((first.next()?.to_string(), first.next()?.to_string()))
}

/// Writes `reply` (its head only for HEAD).
pub fn send(stream: &mut TcpStream, reply: &Reply, head_only: bool) {
    let head = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        reply.status,
        reply.reason(),
        reply.content_type,
        reply.body.len()
    );
    let _ = stream.set_write_timeout(Some(Duration::from_secs(30)));
    let _ = stream.write_all(head.as_bytes());
    if !head_only {
        let _ = stream.write_all(&reply.body);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::pprof;

    fn err(method: &str, target: &str) -> (u16, String) {
        let r = route(method, target).expect_err(target);
        (r.status, String::from_utf8(r.body).unwrap())
    }

    #[test]
    fn routes() {
        assert_eq!(route("GET", "/metrics"), Ok(Route::Metrics));
        assert_eq!(route("GET", "/healthz"), Ok(Route::Healthz));
        assert_eq!(route("GET", "/debug/pprof/"), Ok(Route::Index));
        assert_eq!(route("GET", "/debug/pprof/faults"), Ok(Route::Profile { kind: pprof::FAULTS, seconds: None }));
        assert_eq!(
            route("GET", "/debug/pprof/fault-time?seconds=14&gc=1"),
            Ok(Route::Profile { kind: pprof::FAULT_TIME, seconds: Some(14) })
        );
        assert!(index().contains("/debug/pprof/shootdowns\t"));
        assert_eq!(route("GET", "/debug/pprof/resident"), Ok(Route::Profile { kind: pprof::RESIDENT, seconds: None }));
    }

    #[test]
    fn bad_requests_say_what_is_wrong() {
        let (status, body) = err("GET", "/debug/pprof/heap");
        assert_eq!(status, 404);
        assert!(
            body.contains("\"heap\"") && body.contains("faults, fault-time, major-faults, cow, shootdowns, mmap"),
            "{body}"
        );
        let (status, body) = err("GET", "/debug/pprof/faults?seconds=abc");
        assert_eq!(status, 400);
        assert!(body.contains("\"abc\" is not a whole number"), "{body}");
        let (status, body) = err("GET", "/debug/pprof/faults?seconds=0");
        assert_eq!(status, 400);
        assert!(body.contains("1 to 3600"), "{body}");
        assert_eq!(err("GET", "/debug/pprof/faults?seconds=-5").0, 400);
        assert_eq!(err("GET", "/debug/pprof/faults?seconds=99999").0, 400);
        assert_eq!(err("POST", "/metrics").0, 405);
        assert!(err("GET", "/").1.contains("/metrics"));
        // Resident memory is held now: no window.
        let (status, body) = err("GET", "/debug/pprof/resident?seconds=10");
        assert_eq!(status, 400);
        assert!(body.contains("ask without ?seconds"), "{body}");
    }
}
