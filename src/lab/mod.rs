//! `emisar lab`: a fleet-wide 502 incident (told in [`scenario`]), replayable on one machine.
//!
//! Five runners named `nomad-hvn01` … `nomad-hvn05` run the stock packs unchanged; what
//! stands behind them is the lab's: emulated Consul and Nomad cluster APIs, a Traefik API per
//! node, a real VictoriaMetrics fed with the incident's traffic, and per-node stand-ins for
//! the node commands the packs run (`vtysh`, `systemctl`, `cat`, `uname`, `dpkg-query`),
//! first on each lab runner's PATH. The stand-ins ask the lab process what to print, so one
//! shared state answers every tool and the approved writes change it the way they would
//! change the fleet. A probe at the anycast VIP (`vip`) counts the connections refused
//! there, as the case study's probe did.
//!
//! Invariant: nothing in the product imports this module; only the composition roots
//! (`cli.rs`) and the tests do. The lab binds every port at :0 and reports it.

pub mod clock;
pub mod consul;
pub mod frr;
pub mod hcl;
pub mod http;
pub mod node;
pub mod nomad;
pub mod run;
pub mod scenario;
pub mod standin;
pub mod traefik;
pub mod vip;
pub mod vm;
