//! Integration tests: one binary, each test with its own ports, its own database and, where
//! it needs one, its own real Traefik. Tests that touch the store run on both backends.

mod approval_wait;
mod approvals;
mod approvals_bounds;
mod approvals_preview;
mod audit_log;
mod cli;
mod conformance;
mod door;
mod edges;
mod fleet;
mod governance;
mod governance_rules;
mod harness;
mod hostile;
mod lab;
mod mcp_calls;
mod oidc;
mod oidc_mcp;
mod oidc_portal;
mod ops;
mod outage;
mod packs_cluster;
mod packs_node;
mod packs_redis;
mod packs_test;
mod portal_browser;
mod python_client;
mod replicas;
mod runner_identity;
mod runner_security;
mod runner_security_allowlists;
mod secrets;
mod sockets;
mod tidy;
mod tls;
