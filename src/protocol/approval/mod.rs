//! Signed approvals: what a person signs and how a signature is checked, shared by the server
//! and the runner; pure, no IO.

pub mod webauthn;
