//! `vtysh` on a lab node: FRR 10's BGP daemon with one upstream peer (the edge firewall),
//! answering the commands the frr pack runs with FRR's own JSON shapes and field names
//! (`show bgp summary json` and its variants, `show bgp neighbors [IP] json`, `show bgp ipv4
//! unicast json` and `show bgp ipv4 unicast neighbors IP advertised-routes json`) and applying
//! `neighbor X shutdown` / `no neighbor X shutdown` under `router bgp ASN` the way bgpd does:
//! the session goes `Idle (Admin)` and the node stops advertising (PfxSnt 0), then comes back
//! `Established`. Errors are FRR's texts and exit codes (vtysh stops at the first failing
//! `-c`). Commands the lab does not emulate are refused saying so, never answered with made-up
//! output.

use std::time::{Duration, SystemTime};

use serde_json::{Value, json};

use super::clock::unix_secs;
use super::node::Output;

/// The BGP side of one node.
#[derive(Debug, Clone)]
pub struct Bgp {
    pub asn: u32,
    pub router_id: String,
    /// The prefix every node advertises: the anycast VIP.
    pub network: String,
    pub peer: Peer,
}

/// The node's one neighbor.
#[derive(Debug, Clone)]
pub struct Peer {
    pub ip: String,
    pub remote_as: u32,
    pub description: String,
    pub hostname: String,
    pub router_id: String,
    /// `neighbor X shutdown` is in force, with its message.
    pub shutdown: Option<String>,
    /// The last state change (up or down).
    pub since: SystemTime,
    pub connections_established: u32,
    pub connections_dropped: u32,
    /// Prefixes received from the peer while established (a default route).
    pub received: u32,
}

impl Bgp {
    fn established(&self) -> bool {
        self.peer.shutdown.is_none()
    }

    /// Prefixes this node sends its peer: the anycast VIP while the session is up.
    pub fn advertised(&self) -> u32 {
        if self.established() { 1 } else { 0 }
    }

    fn messages(&self, now: SystemTime) -> (u64, u64) {
        // Keepalives every 3 s (timers 3 9) since the first session, plus the opens and updates.
        let up = now
            .duration_since(self.peer.since)
            .unwrap_or_default()
            .as_secs();
        let base = 5 + up / 3;
        (base, base + 1)
    }

    fn summary(&self, now: SystemTime) -> Value {
        let up = now.duration_since(self.peer.since).unwrap_or_default();
        let (rcvd, sent) = self.messages(now);
        let (state, peer_state) = if self.established() {
            ("Established", "OK")
        } else {
            ("Idle (Admin)", "Admin")
        };
        let received = if self.established() {
            self.peer.received
        } else {
            0
        };
        let mut peers = serde_json::Map::new();
        peers.insert(
            self.peer.ip.clone(),
            json!({"hostname": self.peer.hostname, "remoteAs": self.peer.remote_as, "localAs": self.asn,
                   "version": 4, "msgRcvd": rcvd, "msgSent": sent, "tableVersion": 0, "outq": 0, "inq": 0,
                   "peerUptime": peer_uptime(up), "peerUptimeMsec": up.as_millis() as u64,
                   "peerUptimeEstablishedEpoch": unix_secs(self.peer.since) as u64,
                   "pfxRcd": received, "pfxSnt": self.advertised(), "state": state, "peerState": peer_state,
                   "connectionsEstablished": self.peer.connections_established,
                   "connectionsDropped": self.peer.connections_dropped,
                   "desc": self.peer.description, "idType": "ipv4"}),
        );
        let rib = 1 + received;
        json!({"routerId": self.router_id, "as": self.asn, "vrfId": 0, "vrfName": "default",
               "tableVersion": 2 + self.peer.connections_established + self.peer.connections_dropped,
               "ribCount": rib, "ribMemory": 192 * rib, "peerCount": 1, "peerMemory": 741464,
               "peers": peers, "failedPeers": if self.established() { 0 } else { 1 },
               "displayedPeers": 1, "totalPeers": 1, "dynamicPeers": 0,
               "bestPath": {"multiPathRelax": "false"}})
    }

    fn neighbor(&self, now: SystemTime) -> Value {
        let up = now.duration_since(self.peer.since).unwrap_or_default();
        let (rcvd, sent) = self.messages(now);
        let mut n = json!({
            "remoteAs": self.peer.remote_as, "localAs": self.asn, "nbrExternalLink": true,
            "localRole": "undefined", "remoteRole": "undefined", "nbrDesc": self.peer.description,
            "hostname": self.peer.hostname, "bgpVersion": 4,
            "remoteRouterId": if self.established() { self.peer.router_id.as_str() } else { "0.0.0.0" },
            "localRouterId": self.router_id,
            "bgpState": if self.established() { "Established" } else { "Idle" },
            "bgpTimerLastRead": 1000, "bgpTimerLastWrite": 1000,
            "bgpTimerConfiguredHoldTimeMsecs": 9000, "bgpTimerConfiguredKeepAliveIntervalMsecs": 3000,
            "bgpTimerHoldTimeMsecs": 9000, "bgpTimerKeepAliveIntervalMsecs": 3000,
            "messageStats": {"depthInq": 0, "depthOutq": 0, "opensSent": self.peer.connections_established,
                             "opensRecv": self.peer.connections_established, "notificationsSent": self.peer.connections_dropped,
                             "notificationsRecv": 0, "updatesSent": 3, "updatesRecv": 3,
                             "keepalivesSent": sent.saturating_sub(4), "keepalivesRecv": rcvd.saturating_sub(4),
                             "routeRefreshSent": 0, "routeRefreshRecv": 0, "capabilitySent": 0, "capabilityRecv": 0,
                             "totalSent": sent, "totalRecv": rcvd},
            "minBtwnAdvertisementRunsTimerMsecs": 0,
            "connectionsEstablished": self.peer.connections_established,
            "connectionsDropped": self.peer.connections_dropped,
            "externalBgpNbrMaxHopsAway": 1, "hostLocal": self.router_id, "portLocal": 179,
            "hostForeign": self.peer.ip, "portForeign": 45018, "nexthop": self.router_id,
            "bgpConnection": "sharedNetwork", "connectRetryTimer": 5,
        });
        if self.established() {
            n["bgpTimerUpMsec"] = json!(up.as_millis() as u64);
            n["bgpTimerUpString"] = json!(peer_uptime(up));
            n["bgpTimerUpEstablishedEpoch"] = json!(unix_secs(self.peer.since) as u64);
            n["addressFamilyInfo"] = json!({"ipv4Unicast": {"updateGroupId": 1, "subGroupId": 1, "packetQueueLength": 0,
                "commAttriSentToNbr": "extendedAndStandard", "acceptedPrefixCounter": self.peer.received,
                "sentPrefixCounter": self.advertised()}});
            n["readThread"] = json!("on");
            n["writeThread"] = json!("on");
        } else {
            n["adminShutDown"] = json!(true);
            n["addressFamilyInfo"] = json!({"ipv4Unicast": {"commAttriSentToNbr": "extendedAndStandard",
                "acceptedPrefixCounter": 0}});
            n["lastResetTimerMsecs"] = json!(up.as_millis() as u64);
            n["lastResetDueTo"] = json!("Admin. shutdown");
            n["lastResetCode"] = json!(11);
            n["readThread"] = json!("off");
            n["writeThread"] = json!("off");
        }
        if self.peer.connections_dropped > 0 && self.established() {
            n["lastResetDueTo"] = json!("Admin. shutdown");
            n["lastResetCode"] = json!(11);
        }
        let mut out = serde_json::Map::new();
        out.insert(self.peer.ip.clone(), n);
        Value::Object(out)
    }

    /// The anycast VIP as bgpd lists a route it originates (`network` under the address family).
    fn vip_route(&self) -> (Value, Value) {
        let (addr, len) = self
            .network
            .split_once('/')
            .unwrap_or((&self.network, "32"));
        let len: u32 = len.parse().unwrap_or(32);
        let advertised = json!({"addrPrefix": addr, "prefixLen": len, "network": self.network,
            "nextHop": "0.0.0.0", "metric": 0, "weight": 32768, "path": "", "bgpOriginCode": "i",
            "appliedStatusSymbols": {"*": true, ">": true}});
        let path = json!({"valid": true, "bestpath": true, "selectionReason": "First path received",
            "pathFrom": "external", "prefix": addr, "prefixLen": len, "network": self.network,
            "version": 1, "metric": 0, "weight": 32768, "peerId": "(unspec)", "path": "",
            "origin": "IGP", "nexthops": [{"ip": "0.0.0.0", "hostname": "", "afi": "ipv4", "used": true}]});
        (advertised, path)
    }

    /// `show bgp ipv4 unicast neighbors IP advertised-routes json`: what this node sends its
    /// peer, which is the VIP while the session is up (as `pfxSnt` counts) and nothing while
    /// it is shut down (bgpd then prints only the counters).
    fn advertised_routes(&self) -> Value {
        if !self.established() {
            return json!({"advertisedRoutes": {}, "totalPrefixCounter": 0, "filteredPrefixCounter": 0});
        }
        let mut routes = serde_json::Map::new();
        routes.insert(self.network.clone(), self.vip_route().0);
        json!({"bgpTableVersion": 2 + self.peer.connections_established + self.peer.connections_dropped,
               "bgpLocalRouterId": self.router_id, "defaultLocPrf": 100, "localAS": self.asn,
               "bgpStatusCodes": {"suppressed": "s", "damped": "d", "history": "h", "valid": "*",
                                  "best": ">", "multipath": "=", "internal": "i", "ribFailure": "r",
                                  "stale": "S", "removed": "R"},
               "bgpOriginCodes": {"igp": "i", "egp": "e", "incomplete": "?"},
               "advertisedRoutes": routes, "totalPrefixCounter": self.advertised(),
               "filteredPrefixCounter": 0})
    }

    /// `show bgp ipv4 unicast json`: the VIP this node originates, and the default route its
    /// peer sends while the session is up.
    fn table(&self) -> Value {
        let mut routes = serde_json::Map::new();
        if self.established() && self.peer.received > 0 {
            routes.insert("0.0.0.0/0".into(), json!([{"valid": true, "bestpath": true,
                "selectionReason": "First path received", "pathFrom": "external", "prefix": "0.0.0.0",
                "prefixLen": 0, "network": "0.0.0.0/0", "version": 2, "metric": 0, "weight": 0,
                "peerId": self.peer.ip, "path": self.peer.remote_as.to_string(), "origin": "IGP",
                "nexthops": [{"ip": self.peer.ip, "hostname": self.peer.hostname, "afi": "ipv4", "used": true}]}]));
        }
        routes.insert(self.network.clone(), json!([self.vip_route().1]));
        json!({"vrfId": 0, "vrfName": "default",
               "tableVersion": 2 + self.peer.connections_established + self.peer.connections_dropped,
               "routerId": self.router_id, "defaultLocPrf": 100, "localAS": self.asn, "routes": routes})
    }

    fn running_config(&self, hostname: &str) -> String {
        let shutdown = match &self.peer.shutdown {
            Some(m) if m.is_empty() => format!(" neighbor {} shutdown\n", self.peer.ip),
            Some(m) => format!(" neighbor {} shutdown message {m}\n", self.peer.ip),
            None => String::new(),
        };
        format!(
            "Building configuration...\n\nCurrent configuration:\n!\nfrr version 10.3.1\nfrr defaults traditional\nhostname {hostname}\nservice integrated-vtysh-config\n!\nrouter bgp {asn}\n bgp router-id {rid}\n no bgp ebgp-requires-policy\n neighbor {ip} remote-as {ras}\n neighbor {ip} description {desc}\n{shutdown} neighbor {ip} timers 3 9\n !\n address-family ipv4 unicast\n  network {net}\n exit-address-family\nexit\n!\nend\n",
            asn = self.asn,
            rid = self.router_id,
            ip = self.peer.ip,
            ras = self.peer.remote_as,
            desc = self.peer.description,
            net = self.network,
        )
    }
}

/// FRR's `peer_uptime` text: `hh:mm:ss` within a day, then `XdYYhZZm`, then `XXwYdZZh`.
pub fn peer_uptime(d: Duration) -> String {
    let s = d.as_secs();
    const DAY: u64 = 86_400;
    const WEEK: u64 = 7 * DAY;
    const YEAR: u64 = 365 * DAY;
    if s < DAY {
        format!("{:02}:{:02}:{:02}", s / 3600, (s % 3600) / 60, s % 60)
    } else if s < WEEK {
        format!(
            "{}d{:02}h{:02}m",
            s / DAY,
            (s % DAY) / 3600,
            (s % 3600) / 60
        )
    } else if s < YEAR {
        format!(
            "{:02}w{}d{:02}h",
            s / WEEK,
            (s % WEEK) / DAY,
            (s % DAY) / 3600
        )
    } else {
        format!(
            "{:02}y{:02}w{}d",
            s / YEAR,
            (s % YEAR) / WEEK,
            (s % WEEK) / DAY
        )
    }
}

fn pretty(v: &Value) -> String {
    let mut s = serde_json::to_string_pretty(v).unwrap_or_default();
    s.push('\n');
    s
}

#[derive(PartialEq)]
enum Mode {
    Exec,
    Config,
    RouterBgp,
}

/// Runs `vtysh ARGS` against `bgp` at lab time `now`.
pub fn vtysh(bgp: &mut Bgp, hostname: &str, args: &[String], now: SystemTime) -> Output {
    let mut commands = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_str();
        match a {
            "-c" | "--command" => {
                let Some(c) = args.get(i + 1) else {
                    return Output::fail(1, "vtysh: option requires an argument -- 'c'\n");
                };
                commands.push(c.clone());
                i += 2;
            }
            // The socket directory and daemon selection change nothing in the lab.
            "--vty_socket" | "-d" | "--daemon" | "-N" | "--pathspace" if i + 1 < args.len() => {
                i += 2
            }
            "-E" | "--echo" | "-u" | "--user" | "-w" | "--writeconfig" => i += 1,
            other if other.starts_with("--command=") => {
                commands.push(other["--command=".len()..].to_owned());
                i += 1;
            }
            other => {
                return Output::fail(1, &format!("vtysh: unrecognized option '{other}'\n"));
            }
        }
    }
    if commands.is_empty() {
        return Output::fail(
            1,
            "vtysh: the lab's vtysh runs -c commands only; there is no interactive shell\n",
        );
    }
    let mut mode = Mode::Exec;
    let mut out = String::new();
    for command in commands {
        let words: Vec<&str> = command.split_whitespace().collect();
        let result = match (&mode, words.as_slice()) {
            (_, ["end"]) => {
                mode = Mode::Exec;
                Ok(String::new())
            }
            (Mode::RouterBgp, ["exit"]) => {
                mode = Mode::Config;
                Ok(String::new())
            }
            (Mode::Config, ["exit"]) | (Mode::Exec, ["exit"]) => {
                mode = Mode::Exec;
                Ok(String::new())
            }
            (Mode::Exec, ["configure"] | ["configure", "terminal"]) => {
                mode = Mode::Config;
                Ok(String::new())
            }
            (Mode::Exec, ["show", rest @ ..]) => show(bgp, hostname, rest, now),
            (Mode::Exec, ["write"] | ["write", "memory"] | ["write", "file"]) => Ok(
                "Note: this version of vtysh never writes vtysh.conf\nBuilding Configuration...\nIntegrated configuration saved to /etc/frr/frr.conf\n[OK]\n"
                    .to_owned(),
            ),
            (Mode::Config, ["router", "bgp", asn, rest @ ..]) => {
                if !rest.is_empty() {
                    Err(format!(
                        "% the lab's bgpd has no VRF instances: `{command}`\n"
                    ))
                } else if asn.parse::<u32>() == Ok(bgp.asn) {
                    mode = Mode::RouterBgp;
                    Ok(String::new())
                } else {
                    Err(format!("BGP is already running; AS is {}\n", bgp.asn))
                }
            }
            (Mode::RouterBgp, ["neighbor", ip, "shutdown", rest @ ..]) => {
                if *ip != bgp.peer.ip {
                    Err("% Specify remote-as or peer-group commands first\n".to_owned())
                } else {
                    let message = match rest {
                        [] => Some(String::new()),
                        ["message", words @ ..] if !words.is_empty() => Some(words.join(" ")),
                        _ => None,
                    };
                    match message {
                        Some(m) => {
                            if bgp.peer.shutdown.is_none() {
                                bgp.peer.connections_dropped += 1;
                                bgp.peer.since = now;
                            }
                            bgp.peer.shutdown = Some(m);
                            Ok(String::new())
                        }
                        None => Err(format!("% Unknown command: {command}\n")),
                    }
                }
            }
            (Mode::RouterBgp, ["no", "neighbor", ip, "shutdown", ..]) => {
                if *ip != bgp.peer.ip {
                    Err("% Specify remote-as or peer-group commands first\n".to_owned())
                } else {
                    if bgp.peer.shutdown.take().is_some() {
                        bgp.peer.connections_established += 1;
                        bgp.peer.since = now;
                    }
                    Ok(String::new())
                }
            }
            _ => Err(format!("% Unknown command: {command}\n")),
        };
        match result {
            Ok(text) => out.push_str(&text),
            Err(text) => {
                out.push_str(&text);
                return Output {
                    stdout: out,
                    stderr: String::new(),
                    code: 1,
                };
            }
        }
    }
    Output::ok(out)
}

fn show(bgp: &Bgp, hostname: &str, words: &[&str], now: SystemTime) -> Result<String, String> {
    let wrapped = || json!({"ipv4Unicast": bgp.summary(now)});
    match words {
        ["bgp", "summary", "json"] | ["ip", "bgp", "summary", "json"] => Ok(pretty(&wrapped())),
        ["bgp", "ipv4", "unicast", "summary", "json"]
        | ["ip", "bgp", "ipv4", "unicast", "summary", "json"]
        | ["bgp", "ipv4", "summary", "json"] => Ok(pretty(&bgp.summary(now))),
        ["bgp", "vrf", "all", "summary", "json"] => Ok(pretty(&json!({"default": wrapped()}))),
        ["bgp", "vrf", "default", "summary", "json"] => Ok(pretty(&wrapped())),
        ["bgp", "vrf", _, "summary", "json"] => Ok(pretty(&json!({}))),
        ["bgp", "neighbors", "json"] | ["ip", "bgp", "neighbors", "json"] => {
            Ok(pretty(&bgp.neighbor(now)))
        }
        ["bgp", "neighbors", ip, "json"] | ["ip", "bgp", "neighbors", ip, "json"] => {
            if *ip == bgp.peer.ip {
                Ok(pretty(&bgp.neighbor(now)))
            } else if ip.parse::<std::net::IpAddr>().is_ok() {
                Ok(pretty(&json!({"bgpNoSuchNeighbor": true})))
            } else {
                Err(format!("% Unknown command: show {}\n", words.join(" ")))
            }
        }
        [
            "bgp",
            "ipv4",
            "unicast",
            "neighbors",
            ip,
            "advertised-routes",
            "json",
        ] => {
            if *ip == bgp.peer.ip {
                Ok(pretty(&bgp.advertised_routes()))
            } else if ip.parse::<std::net::IpAddr>().is_ok() {
                Ok(pretty(
                    &json!({"warning": "No such neighbor in this view/vrf"}),
                ))
            } else {
                Err(format!("% Unknown command: show {}\n", words.join(" ")))
            }
        }
        ["bgp", "ipv4", "unicast", "json"] | ["ip", "bgp", "json"] => Ok(pretty(&bgp.table())),
        ["running-config"] | ["running-config", "bgpd"] => Ok(bgp.running_config(hostname)),
        _ => Err(format!(
            "% the lab's vtysh does not emulate `show {}` (it answers the BGP summary, neighbors, IPv4 unicast table and advertised routes in json, and the running config)\n",
            words.join(" ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bgp(now: SystemTime) -> Bgp {
        Bgp {
            asn: 65100,
            router_id: "10.0.0.105".into(),
            network: "10.0.0.250/32".into(),
            peer: Peer {
                ip: "10.0.0.1".into(),
                remote_as: 65000,
                description: "upstream-edge-fw".into(),
                hostname: "edge-fw".into(),
                router_id: "10.0.0.1".into(),
                shutdown: None,
                since: now - Duration::from_secs(3 * 86_400 + 3600),
                connections_established: 1,
                connections_dropped: 0,
                received: 1,
            },
        }
    }

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    /// What a preview of a shutdown or an enable reads: the routes sent to the peer (the VIP
    /// while up, none while shut down, as `pfxSnt` counts) and the table (the peer's default
    /// route only while the session is up), in bgpd's JSON shapes.
    #[test]
    fn advertised_routes_and_the_table_follow_the_session() {
        let now = SystemTime::now();
        let mut b = bgp(now);
        let show = |b: &mut Bgp, command: &str| {
            let o = vtysh(b, "h", &args(&["-c", command]), now);
            assert_eq!(o.code, 0, "{command}: {o:?}");
            serde_json::from_str::<Value>(&o.stdout).unwrap()
        };
        let advertised = "show bgp ipv4 unicast neighbors 10.0.0.1 advertised-routes json";
        let up = show(&mut b, advertised);
        assert_eq!(
            up["advertisedRoutes"]["10.0.0.250/32"]["network"],
            "10.0.0.250/32"
        );
        assert_eq!(up["advertisedRoutes"].as_object().unwrap().len(), 1);
        assert_eq!(up["totalPrefixCounter"], 1);
        let table = show(&mut b, "show bgp ipv4 unicast json");
        let routes = table["routes"].as_object().unwrap();
        assert_eq!(
            routes.keys().collect::<Vec<_>>(),
            ["0.0.0.0/0", "10.0.0.250/32"]
        );
        assert_eq!(routes["0.0.0.0/0"][0]["peerId"], "10.0.0.1");
        assert_eq!(routes["10.0.0.250/32"][0]["peerId"], "(unspec)");

        let shut = [
            "-c",
            "configure terminal",
            "-c",
            "router bgp 65100",
            "-c",
            "neighbor 10.0.0.1 shutdown",
        ];
        assert_eq!(vtysh(&mut b, "h", &args(&shut), now).code, 0);
        let down = show(&mut b, advertised);
        assert_eq!(
            down,
            json!({"advertisedRoutes": {}, "totalPrefixCounter": 0, "filteredPrefixCounter": 0})
        );
        let table = show(&mut b, "show bgp ipv4 unicast json");
        assert_eq!(
            table["routes"]
                .as_object()
                .unwrap()
                .keys()
                .collect::<Vec<_>>(),
            ["10.0.0.250/32"]
        );

        let other = show(
            &mut b,
            "show bgp ipv4 unicast neighbors 10.0.0.9 advertised-routes json",
        );
        assert_eq!(
            other,
            json!({"warning": "No such neighbor in this view/vrf"})
        );
    }

    #[test]
    fn uptime_text_is_frr_s() {
        assert_eq!(peer_uptime(Duration::from_secs(7)), "00:00:07");
        assert_eq!(
            peer_uptime(Duration::from_secs(3 * 86_400 + 3720)),
            "3d01h02m"
        );
        assert_eq!(peer_uptime(Duration::from_secs(23 * 86_400)), "03w2d00h");
    }

    #[test]
    fn shutdown_and_enable_under_the_right_asn() {
        let now = SystemTime::now();
        let mut b = bgp(now);
        let summary = |b: &mut Bgp| -> Value {
            let o = vtysh(b, "h", &args(&["-c", "show bgp summary json"]), now);
            assert_eq!(o.code, 0);
            serde_json::from_str(&o.stdout).unwrap()
        };
        assert_eq!(
            summary(&mut b)["ipv4Unicast"]["peers"]["10.0.0.1"]["pfxSnt"],
            1
        );
        let wrong = vtysh(
            &mut b,
            "h",
            &args(&[
                "-c",
                "configure terminal",
                "-c",
                "router bgp 1",
                "-c",
                "neighbor 10.0.0.1 shutdown",
                "-c",
                "end",
            ]),
            now,
        );
        assert_eq!(wrong.code, 1);
        assert_eq!(wrong.stdout, "BGP is already running; AS is 65100\n");
        assert!(b.peer.shutdown.is_none(), "vtysh stops at the first error");
        let unknown = vtysh(
            &mut b,
            "h",
            &args(&[
                "-c",
                "configure terminal",
                "-c",
                "router bgp 65100",
                "-c",
                "neighbor 10.9.9.9 shutdown",
            ]),
            now,
        );
        assert_eq!(
            unknown.stdout,
            "% Specify remote-as or peer-group commands first\n"
        );
        let shut = vtysh(
            &mut b,
            "h",
            &args(&[
                "-c",
                "configure terminal",
                "-c",
                "router bgp 65100",
                "-c",
                "neighbor 10.0.0.1 shutdown message emisar: approved shutdown",
                "-c",
                "end",
            ]),
            now,
        );
        assert_eq!(shut.code, 0, "{}", shut.stdout);
        let s = summary(&mut b);
        let peer = &s["ipv4Unicast"]["peers"]["10.0.0.1"];
        assert_eq!(peer["state"], "Idle (Admin)");
        assert_eq!(peer["pfxSnt"], 0);
        assert_eq!(s["ipv4Unicast"]["failedPeers"], 1);
        let n = vtysh(
            &mut b,
            "h",
            &args(&["-c", "show bgp neighbors 10.0.0.1 json"]),
            now,
        );
        let n: Value = serde_json::from_str(&n.stdout).unwrap();
        assert_eq!(n["10.0.0.1"]["adminShutDown"], true);
        assert_eq!(n["10.0.0.1"]["bgpState"], "Idle");
        let on = vtysh(
            &mut b,
            "h",
            &args(&[
                "-c",
                "configure terminal",
                "-c",
                "router bgp 65100",
                "-c",
                "no neighbor 10.0.0.1 shutdown",
                "-c",
                "end",
            ]),
            now,
        );
        assert_eq!(on.code, 0);
        let peer = summary(&mut b)["ipv4Unicast"]["peers"]["10.0.0.1"].clone();
        assert_eq!(peer["state"], "Established");
        assert_eq!(peer["pfxSnt"], 1);
        assert_eq!(peer["connectionsEstablished"], 2);
        let missing = vtysh(
            &mut b,
            "h",
            &args(&["-c", "show bgp neighbors 10.0.0.9 json"]),
            now,
        );
        assert_eq!(missing.stdout.trim(), "{\n  \"bgpNoSuchNeighbor\": true\n}");
        assert_eq!(
            vtysh(&mut b, "h", &args(&["-c", "bogus"]), now).stdout,
            "% Unknown command: bogus\n"
        );
    }
}
