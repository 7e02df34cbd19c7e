//! The DNS-rebinding door, in front of every route: the `Host` a request names must be one of
//! this server's (`allowed_hosts`, the host of `public_url`, the bound address), and a
//! request to `/mcp` that carries an `Origin` must come from this server's own origin or one
//! the operator allows (`allowed_origins`; the MCP specification says servers MUST check it).
//!
//! A page on another site that rebinds its name to this server's address reaches it with its
//! own name in `Host` and its own origin in `Origin`; both are refused here, before any
//! handler, so it can neither sign in, join, read the portal nor call tools. A request without
//! `Origin` is not from a page that a browser guards (MCP clients, the CLI, runners) and passes.
//!
//! The router answers a refusal (`http`'s `refuse_rebinding`, a 403 whose code is
//! `host_not_allowed` or `origin_not_allowed`); here is only the check, which `config` also
//! uses to read the allowed origins.
//!
//! Invariants: the check runs before authentication and touches no state; `/healthz` and
//! `/readyz` skip the `Host` check (load balancers and orchestrators probe each replica by its
//! address, and the answers say only whether it is up); a refusal names the header and the
//! setting to change, never the header's value.

use axum::http::uri::Authority;
use axum::http::{HeaderMap, Uri, header};

/// Paths probes reach by a replica's address, whatever name clients use.
const PROBES: [&str; 2] = ["/healthz", "/readyz"];

/// A host as compared: lowercase, IPv6 without brackets, and its port if it names one.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HostPort {
    host: String,
    port: Option<u16>,
}

impl HostPort {
    fn parse(text: &str) -> Option<HostPort> {
        let authority = Authority::try_from(text.trim()).ok()?;
        // Userinfo (`user@host`) is no part of a Host header or an origin.
        if authority.as_str().contains('@') {
            return None;
        }
        Some(HostPort {
            host: authority
                .host()
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_ascii_lowercase(),
            port: authority.port_u16(),
        })
    }

    /// An `allowed_hosts` entry: a host or `host:port` as in a Host header, or a bare IPv6
    /// address (`::1`, as in the default), which a Host header would bracket.
    fn allowed(text: &str) -> Option<HostPort> {
        HostPort::parse(text).or_else(|| {
            let ip: std::net::Ipv6Addr = text.trim().parse().ok()?;
            Some(HostPort {
                host: ip.to_string(),
                port: None,
            })
        })
    }
}

/// An origin (RFC 6454): scheme, host and port, the port filled in from the scheme when the
/// serialization leaves it out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Origin {
    scheme: String,
    host: String,
    port: u16,
}

impl Origin {
    /// `scheme://host[:port]` (`http` or `https`, nothing after the authority but an optional
    /// `/`), or a message naming the rule it broke (without echoing it).
    pub(crate) fn parse(text: &str) -> Result<Origin, String> {
        let uri: Uri = text
            .trim()
            .parse()
            .map_err(|_| "must be an origin such as https://app.example.com".to_owned())?;
        let scheme = uri.scheme_str().map(str::to_ascii_lowercase);
        let default_port = match scheme.as_deref() {
            Some("http") => 80,
            Some("https") => 443,
            _ => return Err("must start with http:// or https://".into()),
        };
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
            return Err("must be scheme://host[:port], with no path or query".into());
        }
        let host = uri
            .authority()
            .and_then(|a| HostPort::parse(a.as_str()))
            .ok_or_else(|| "must name a host, without user information".to_owned())?;
        Ok(Origin {
            scheme: scheme.unwrap_or_default(),
            port: host.port.unwrap_or(default_port),
            host: host.host,
        })
    }

    /// The host, lowercase (an IPv6 address without brackets).
    pub(crate) fn host(&self) -> &str {
        &self.host
    }

    /// `http` or `https`.
    pub(crate) fn scheme(&self) -> &str {
        &self.scheme
    }

    /// The origin as a browser serializes it: `scheme://host`, with `:port` only when it is
    /// not the scheme's default.
    pub(crate) fn serialized(&self) -> String {
        let default = if self.scheme == "https" { 443 } else { 80 };
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        if self.port == default {
            format!("{}://{host}", self.scheme)
        } else {
            format!("{}://{host}:{}", self.scheme, self.port)
        }
    }

    /// Whether this origin is the server's own as the request reached it: the same host and
    /// port as its `Host` (a `Host` without a port means the scheme's default). The scheme is
    /// not compared: behind a proxy that terminates TLS the server sees plain HTTP.
    fn is_same_as(&self, host: &HostPort) -> bool {
        self.host == host.host
            && host
                .port
                .unwrap_or(if self.scheme == "https" { 443 } else { 80 })
                == self.port
    }
}

/// The hosts and origins this server answers to.
#[derive(Debug, Clone)]
pub(crate) struct Allowed {
    /// A host without a port allows every port; with one, only that port.
    hosts: Vec<HostPort>,
    /// Origins besides the server's own that may call `/mcp`.
    origins: Vec<Origin>,
}

impl Allowed {
    /// `hosts` as in `allowed_hosts` (`name` or `name:port`), `origins` as in
    /// `allowed_origins`. Entries that do not parse allow nothing (the configuration check
    /// refuses them before the server starts).
    pub(crate) fn new(hosts: &[String], origins: &[String]) -> Allowed {
        Allowed {
            hosts: hosts.iter().filter_map(|h| HostPort::allowed(h)).collect(),
            origins: origins
                .iter()
                .filter_map(|o| Origin::parse(o).ok())
                .collect(),
        }
    }

    fn host_allowed(&self, host: &HostPort) -> bool {
        self.hosts
            .iter()
            .any(|a| a.host == host.host && a.port.is_none_or(|p| host.port == Some(p)))
    }

    /// The refusal, if the request's `Host` (on every path but the probes) or its `Origin`
    /// (on `/mcp`) is not this server's: which header, and the sentence the caller reads.
    pub(crate) fn check(&self, uri: &Uri, headers: &HeaderMap) -> Result<(), Refusal> {
        let path = uri.path();
        if PROBES.contains(&path) {
            return Ok(());
        }
        // HTTP/2 carries the host in `:authority`, which hyper puts in the URI.
        let host = match headers.get(header::HOST) {
            Some(v) => v.to_str().ok().and_then(HostPort::parse),
            None => uri.authority().and_then(|a| HostPort::parse(a.as_str())),
        };
        let host = match host {
            Some(host) if self.host_allowed(&host) => host,
            _ => {
                return Err(Refusal::Host(
                    "refused: the Host header does not name this server; add the name clients use to allowed_hosts (DNS-rebinding protection)",
                ));
            }
        };
        if !(path == "/mcp" || path.starts_with("/mcp/")) {
            return Ok(());
        }
        let Some(origin) = headers.get(header::ORIGIN) else {
            return Ok(());
        };
        let allowed = origin
            .to_str()
            .ok()
            .and_then(|o| Origin::parse(o).ok())
            .is_some_and(|o| o.is_same_as(&host) || self.origins.contains(&o));
        if allowed {
            return Ok(());
        }
        Err(Refusal::Origin(
            "refused: the Origin header is not this server's; a browser-based MCP client's origin must be in allowed_origins",
        ))
    }
}

/// Why [`Allowed::check`] refused a request, with the sentence the caller reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The `Host` header does not name this server.
    Host(&'static str),
    /// The `Origin` of a request to `/mcp` is not this server's nor an allowed one.
    Origin(&'static str),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed() -> Allowed {
        Allowed::new(
            &[
                "localhost".into(),
                "emisar.example:8443".into(),
                "::1".into(),
            ],
            &["https://app.example".into()],
        )
    }

    fn check(path: &str, host: &str, origin: Option<&str>) -> Result<(), Refusal> {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, host.parse().unwrap());
        if let Some(o) = origin {
            headers.insert(header::ORIGIN, o.parse().unwrap());
        }
        allowed().check(&path.parse().unwrap(), &headers)
    }

    #[test]
    fn hosts_are_checked_on_every_path_but_the_probes() {
        assert!(check("/api/login", "localhost:7700", None).is_ok());
        assert!(check("/api/login", "LOCALHOST", None).is_ok());
        assert!(check("/api/login", "[::1]:7700", None).is_ok());
        assert!(check("/", "emisar.example:8443", None).is_ok());
        for (path, host) in [
            ("/api/login", "evil.example:7700"),
            ("/api/runners/join", "evil.example"),
            ("/", "emisar.example:7700"),
            ("/metrics", "evil.example"),
            ("/mcp", "evil.example"),
            ("/api/login", "user@localhost"),
        ] {
            let e = check(path, host, None).unwrap_err();
            assert!(matches!(e, Refusal::Host(_)), "{path} {host}: {e:?}");
        }
        assert!(check("/healthz", "10.0.0.2:7700", None).is_ok());
        assert!(check("/readyz", "10.0.0.2:7700", None).is_ok());
    }

    #[test]
    fn origins_on_mcp_must_be_the_servers_own_or_allowed() {
        assert!(check("/mcp", "localhost:7700", None).is_ok());
        assert!(check("/mcp", "localhost:7700", Some("http://localhost:7700")).is_ok());
        assert!(check("/mcp", "localhost", Some("https://localhost")).is_ok());
        assert!(check("/mcp", "localhost:7700", Some("https://app.example")).is_ok());
        assert!(check("/mcp", "localhost:7700", Some("https://app.example:443")).is_ok());
        for origin in [
            "http://evil.example",
            "http://localhost:3000",
            "https://app.example:8443",
            "null",
            "not an origin",
        ] {
            let e = check("/mcp", "localhost:7700", Some(origin)).unwrap_err();
            assert!(matches!(e, Refusal::Origin(_)), "{origin}: {e:?}");
        }
        // The portal's own requests are same-origin; Origin is checked on /mcp only.
        assert!(check("/api/login", "localhost:7700", Some("http://evil.example")).is_ok());
    }

    #[test]
    fn configured_origins_are_checked() {
        assert!(Origin::parse("https://app.example:8443").is_ok());
        assert!(Origin::parse("https://app.example/").is_ok());
        for bad in [
            "app.example",
            "ftp://app.example",
            "https://app.example/path",
            "https://u@app.example",
        ] {
            assert!(Origin::parse(bad).is_err(), "{bad}");
        }
    }
}
