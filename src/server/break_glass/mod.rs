//! Break-glass on the server (issue 47): the windows as the audit log tells them
//! (`ledger.rs`, pure) and people's signed review of a closed window (`reviews.rs`, the
//! `break_glass_reviews` table and the `break_glass.reviewed` event). A window itself is a
//! grant flagged `break_glass` (`protocol/approval/grant.rs`), stored and run like any grant.

pub mod ledger;
pub mod reviews;

pub use ledger::{State, Window, WindowCall, WindowReview, windows};
pub use reviews::{ReviewError, ReviewRow, Reviews, Signer, windows_in_log};
