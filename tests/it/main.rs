//! Integration tests: one binary, each test with its own ports, its own database and, where
//! it needs one, its own real Traefik. Tests that touch the store run on both backends.

// The tests start the real services they drive (clippy.toml keeps product code from it).
#![allow(clippy::disallowed_methods)]

mod alert_rules;
mod alerts_fire;
mod approval_wait;
mod approvals;
mod approvals_bounds;
mod approvals_preview;
mod audit_activity;
mod audit_log;
mod cli;
mod conformance;
mod conformance_tasks;
mod decision_browser;
mod door;
mod edges;
mod fleet;
mod fleet_scale;
mod floods;
mod governance;
mod governance_rules;
mod grants;
mod harness;
mod hostile;
mod join_bounds;
mod lab;
mod lab_rollout;
mod mcp_calls;
mod notices;
mod oidc;
mod oidc_mcp;
mod oidc_portal;
mod openapi;
mod ops;
mod outage;
mod packs_cluster;
mod packs_node;
mod packs_nomad_writes;
mod packs_redis;
mod packs_test;
mod passkey_browser;
mod passkeys;
mod portal_browser;
mod portal_fleet;
mod portal_grid;
mod portal_sessions;
mod portal_statement;
mod python_client;
mod replicas;
mod rollout_decisions;
mod rollouts;
mod runner_errors;
mod runner_identity;
mod runner_security;
mod runner_security_allowlists;
mod secrets;
mod signed_approvals;
mod sockets;
mod tasks;
mod tidy;
mod tls;
mod transparency;
mod trust_promises;
mod witness;
