//! Where a joined runner may be reached: `[join] allowed_networks`.
//!
//! A join token's holder chooses the URL the server then probes and calls. Without a bound,
//! that makes every join token a port and host scanner for what the server can reach
//! (loopback, the cloud metadata address, the server itself). So a joined runner's address
//! must lie in an allowed network: the URL's host when it is an address, and every address a
//! name resolves to, checked when the runner joins or re-registers *and* on each connection
//! (the runner's client resolves through [`AllowedResolver`], so a name that later resolves
//! elsewhere, DNS rebinding, reaches nothing outside).
//!
//! Defaults: the private ranges (RFC 1918, RFC 6598 shared space, IPv6 unique local), never
//! loopback, link-local, multicast or unspecified addresses. `allowed_networks` replaces the
//! default with the operator's list (loopback only when listed, as tests do). The server's
//! own listening address is refused whatever the list says.
//!
//! Runners from the server's config are the operator's own and are not checked here.
//!
//! Written here rather than taken from a crate: the CIDR arithmetic is `ipnet`'s; what is
//! ours is only which addresses count, and the reqwest resolver hook.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;

/// The networks a joined runner may be reached in, and this server's own addresses.
#[derive(Debug, Clone)]
pub(crate) struct JoinNetworks {
    allowed: Vec<IpNet>,
    /// `allowed_networks` was given: its list, not the default, decides.
    explicit: bool,
    /// Where this server listens: never a runner.
    own: Vec<SocketAddr>,
}

/// The default when `allowed_networks` is not set: private ranges only.
const DEFAULT_ALLOWED: &[&str] = &[
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",
    "fc00::/7",
];

impl JoinNetworks {
    /// `allowed`: the `[join] allowed_networks` list (CIDRs or single addresses), or `None`
    /// for the default. Each entry that does not parse is an error naming it.
    pub(crate) fn new(allowed: Option<&[String]>, own: Vec<SocketAddr>) -> Result<Self, String> {
        let explicit = allowed.is_some();
        let texts: Vec<String> = match allowed {
            Some(list) => list.to_vec(),
            None => DEFAULT_ALLOWED.iter().map(|s| (*s).to_owned()).collect(),
        };
        let mut nets = Vec::with_capacity(texts.len());
        for text in &texts {
            nets.push(parse_net(text).ok_or_else(|| {
                format!(
                    "join.allowed_networks: `{}` is not a network (CIDR such as 10.0.0.0/8 or fd00::/8, or one address)",
                    text.escape_debug()
                )
            })?);
        }
        Ok(JoinNetworks {
            allowed: nets,
            explicit,
            own,
        })
    }

    /// The default networks, with `own` as this server's addresses.
    pub(crate) fn default_with(own: Vec<SocketAddr>) -> Self {
        Self::new(None, own).expect("the default networks parse")
    }

    /// Why a joined runner may not be reached at `addr`, if it may not.
    pub(crate) fn refuses(&self, addr: SocketAddr) -> Option<String> {
        let ip = addr.ip().to_canonical();
        if self.is_own(ip, addr.port()) {
            return Some(format!(
                "{addr} is this server's own address: a runner cannot be the server"
            ));
        }
        let always_refused = ip.is_unspecified() || ip.is_multicast() || is_broadcast(ip);
        if always_refused {
            return Some(format!("{ip} is not a host address"));
        }
        if self.allowed.iter().any(|net| net.contains(&ip)) {
            return None;
        }
        Some(if self.explicit {
            format!("{ip} is outside join.allowed_networks")
        } else if ip.is_loopback() || is_link_local(ip) {
            format!(
                "{ip} is a loopback or link-local address, which joined runners may not use unless join.allowed_networks lists it"
            )
        } else {
            format!(
                "{ip} is outside the private networks joined runners may use by default; list it in join.allowed_networks"
            )
        })
    }

    fn is_own(&self, ip: IpAddr, port: u16) -> bool {
        self.own.iter().any(|own| {
            own.port() == port
                && (own.ip().to_canonical() == ip
                    // Listening on every address: each of this host's addresses is the
                    // server; loopback is the one known without asking the system.
                    || (own.ip().is_unspecified() && ip.is_loopback()))
        })
    }

    /// Checks the host of `url` (an address, or a name and every address it resolves to
    /// now). The message names the rule, never the resolver's own error text.
    pub(crate) async fn check_url(&self, url: &reqwest::Url) -> Result<(), String> {
        let port = url
            .port_or_known_default()
            .ok_or("`url` has no port and no known default port")?;
        let host = url.host_str().ok_or("`url` has no host")?;
        if let Some(ip) = literal_ip(url) {
            return self.check_all(&[SocketAddr::new(ip, port)]);
        }
        let addrs: Vec<SocketAddr> = match tokio::net::lookup_host((host, port)).await {
            Ok(addrs) => addrs.collect(),
            Err(_) => Vec::new(),
        };
        if addrs.is_empty() {
            return Err(
                "`url`: its host name does not resolve here; use a name the server resolves, or an address".into(),
            );
        }
        // The joiner learns that the name resolves outside, never to what: the server's
        // resolver is not an oracle for names inside.
        match self.check_all(&addrs) {
            Ok(()) => Ok(()),
            Err(_) => Err(
                "`url`: its host name resolves to an address outside the networks joined runners may use (join.allowed_networks)".into(),
            ),
        }
    }

    fn check_all(&self, addrs: &[SocketAddr]) -> Result<(), String> {
        match addrs.iter().find_map(|a| self.refuses(*a)) {
            Some(why) => Err(format!("`url`: {why}")),
            None => Ok(()),
        }
    }
}

/// The address in `url`'s host, when it is one rather than a name.
pub(crate) fn literal_ip(url: &reqwest::Url) -> Option<IpAddr> {
    // An IPv6 host is written in brackets; a name never parses as an address.
    url.host_str()?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .ok()
}

fn parse_net(text: &str) -> Option<IpNet> {
    if let Ok(net) = text.parse::<IpNet>() {
        return Some(net.trunc());
    }
    text.parse::<IpAddr>().ok().map(IpNet::from)
}

fn is_link_local(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    }
}

fn is_broadcast(ip: IpAddr) -> bool {
    matches!(ip, IpAddr::V4(v4) if v4.is_broadcast())
}

/// The resolver of a joined runner's client: the system's answer, less every address the
/// networks refuse. A name that resolves only to refused addresses fails to connect, and
/// the error says why (not which addresses), so a rebinding name reaches nothing outside.
pub(crate) struct AllowedResolver {
    networks: Arc<JoinNetworks>,
    /// The port of the runner's URL: the server's own address is an address *and* a port.
    port: u16,
}

impl AllowedResolver {
    pub(crate) fn new(networks: Arc<JoinNetworks>, port: u16) -> Self {
        AllowedResolver { networks, port }
    }
}

impl reqwest::dns::Resolve for AllowedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let networks = self.networks.clone();
        let port = self.port;
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let found: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), port))
                .await?
                .collect();
            let allowed: Vec<SocketAddr> = found
                .iter()
                .copied()
                .filter(|a| networks.refuses(*a).is_none())
                .collect();
            if allowed.is_empty() {
                let why = found
                    .first()
                    .and_then(|a| networks.refuses(*a))
                    .unwrap_or_else(|| "the name resolves to no address".into());
                return Err(format!("not connecting: {why}").into());
            }
            Ok(Box::new(allowed.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    #[test]
    fn the_default_admits_private_ranges_only() {
        let own = vec![at("10.0.0.5:7700")];
        let n = JoinNetworks::default_with(own);
        for ok in [
            "10.1.2.3:7701",
            "172.20.0.1:7701",
            "192.168.1.9:443",
            "100.64.0.7:7701",
            "[fd00::7]:7701",
            // The server's address on another port is another service of that host.
            "10.0.0.5:7701",
        ] {
            assert_eq!(n.refuses(at(ok)), None, "{ok}");
        }
        for (bad, why) in [
            ("127.0.0.1:7701", "loopback"),
            ("[::1]:7701", "loopback"),
            ("169.254.169.254:443", "link-local"),
            ("[fe80::1]:7701", "link-local"),
            ("[::ffff:127.0.0.1]:7701", "loopback"),
            ("8.8.8.8:443", "private networks"),
            ("0.0.0.0:7701", "not a host"),
            ("224.0.0.1:7701", "not a host"),
            ("255.255.255.255:7701", "not a host"),
            ("10.0.0.5:7700", "own address"),
        ] {
            let got = n.refuses(at(bad)).unwrap_or_default();
            assert!(got.contains(why), "{bad}: {got}");
        }
    }

    #[test]
    fn a_list_replaces_the_default_but_never_admits_the_server() {
        let n = JoinNetworks::new(
            Some(&["127.0.0.0/8".into(), "203.0.113.7".into()]),
            vec![at("0.0.0.0:7700")],
        )
        .unwrap();
        assert_eq!(n.refuses(at("127.0.0.1:7701")), None);
        assert_eq!(n.refuses(at("203.0.113.7:443")), None);
        assert!(
            n.refuses(at("10.0.0.1:7701"))
                .unwrap()
                .contains("outside join.allowed_networks")
        );
        assert!(n.refuses(at("127.0.0.1:7700")).unwrap().contains("own"));
        let err = JoinNetworks::new(Some(&["10.0.0.0/33".into()]), vec![]).unwrap_err();
        assert!(err.contains("join.allowed_networks") && err.contains("10.0.0.0/33"));
    }

    #[tokio::test]
    async fn names_are_checked_by_every_address_they_resolve_to() {
        let n = JoinNetworks::default_with(vec![]);
        let url = reqwest::Url::parse("https://localhost:7701").unwrap();
        let err = n.check_url(&url).await.unwrap_err();
        assert!(
            err.contains("resolves to an address outside") && !err.contains("127.0.0.1"),
            "{err}"
        );
        let url = reqwest::Url::parse("https://192.168.3.4:7701").unwrap();
        n.check_url(&url).await.unwrap();

        // The resolver a runner's client connects through drops what the check refuses.
        let resolver = AllowedResolver::new(Arc::new(n), 7701);
        let name: reqwest::dns::Name = "localhost".parse().unwrap();
        let err = reqwest::dns::Resolve::resolve(&resolver, name)
            .await
            .err()
            .unwrap();
        assert!(err.to_string().contains("loopback"), "{err}");
    }
}
