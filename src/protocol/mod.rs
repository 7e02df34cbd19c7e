//! What crosses the wire between the server and a runner, and nothing else: the call request
//! and answer, the signed call claims, and the join handshake. Both sides import these types
//! from here; neither side imports the other.

pub mod call;
pub mod join;
pub mod signing;

pub use call::{CallRequest, CallResponse, Mode};
pub use join::{JoinRequest, JoinResponse};
