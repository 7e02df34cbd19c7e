//! What the audit log keeps of a call's arguments: secret params as a keyed HMAC.

use serde_json::{Map, Value, json};

use super::state::Gateway;
use crate::pack::ToolRef;

impl Gateway {
    /// The arguments as the audit log keeps them: secret params as a keyed HMAC.
    pub(super) fn redact(&self, tool: &ToolRef, params: &Map<String, Value>) -> Value {
        let mut out = params.clone();
        for name in tool.secret_params() {
            if let Some(value) = out.get(name) {
                let text = crate::pack::template_text(value).unwrap_or_else(|| value.to_string());
                let sealed = match &self.audit_key {
                    Some(key) => key.seal(&text),
                    // Unreachable: Gateway::new refuses secret params without a key.
                    None => "[secret]".to_owned(),
                };
                out.insert(name.to_owned(), json!(sealed));
            }
        }
        Value::Object(out)
    }
}
