//! What crosses the wire between the server and a runner, and nothing else: the call request
//! and answer, the signed call claims, the join token and the join and re-registration
//! handshakes. Both sides import these types from here; neither side imports the other.

pub mod approval;
pub mod audit_event;
pub mod call;
pub mod join;
pub mod signing;
pub mod witnessed;

pub use call::{CallRequest, CallResponse, Mode};
pub use join::{
    HeartbeatResponse, JoinRequest, JoinResponse, JoinToken, JoinTokenError, RegisterRequest,
    RegisterResponse, ServerPins,
};
