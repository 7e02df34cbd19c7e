//! The API's OpenAPI 3.1 document (`openapi.yaml`, embedded): served as JSON at
//! `GET /api/openapi.json`, and the route table `api::routes` mounts.
//!
//! Axum cannot list the routes it serves, so the document is not checked against a router
//! after the fact: the router is built from it (`api::try_routes`), which makes a route the
//! document lacks, or an operation the router lacks, a failure at build time that the unit
//! tests here reach; the integration test `openapi::the_document_is_what_the_server_serves`
//! then calls every operation on a running server.
//!
//! Invariants: the document parses, is OpenAPI 3.1, names each operation once with an
//! `operationId`, and its doors (`security`) match the table's; every documented request
//! body and query string, built from the document's examples, is read by the handler's own
//! type.

use std::sync::LazyLock;

use axum::Json;
use axum::response::{IntoResponse, Response};
use axum::routing::MethodFilter;
use serde_json::Value;

use super::Access;

/// The document as written.
pub(crate) const SOURCE: &str = include_str!("openapi.yaml");

static DOCUMENT: LazyLock<Value> = LazyLock::new(|| {
    yaml_serde::from_str(SOURCE).expect("src/server/http/api/openapi.yaml is YAML (tested)")
});

/// The document, as JSON.
pub fn document() -> &'static Value {
    &DOCUMENT
}

/// `GET /api/openapi.json`.
pub(crate) async fn serve() -> Response {
    Json(document()).into_response()
}

/// One operation of the document.
#[derive(Debug, Clone)]
pub struct Operation {
    pub id: String,
    /// Upper case, e.g. `POST`.
    pub method: String,
    pub filter: MethodFilter,
    /// As axum writes it too, e.g. `/api/approvals/{id}`.
    pub path: String,
    pub access: Access,
    /// The operation's object in the document.
    pub spec: Value,
}

const METHODS: [(&str, MethodFilter); 5] = [
    ("get", MethodFilter::GET),
    ("post", MethodFilter::POST),
    ("put", MethodFilter::PUT),
    ("patch", MethodFilter::PATCH),
    ("delete", MethodFilter::DELETE),
];

/// The security schemes that `http::door::bearer_auth` checks: an operation that names one is
/// behind the door; one that names only the others (or none) is open, its handler checking
/// its own credential.
const DOOR_SCHEMES: [&str; 2] = ["bearer", "session"];

/// Every operation of the document, in its order.
pub fn operations() -> Vec<Operation> {
    let doc = document();
    let default_security = doc.get("security").cloned().unwrap_or(Value::Null);
    let mut out = Vec::new();
    let Some(paths) = doc["paths"].as_object() else {
        return out;
    };
    for (path, item) in paths {
        for (name, filter) in METHODS {
            let Some(spec) = item.get(name) else {
                continue;
            };
            let security = spec.get("security").unwrap_or(&default_security);
            let door = security.as_array().is_some_and(|schemes| {
                schemes.iter().any(|s| {
                    s.as_object()
                        .is_some_and(|o| o.keys().any(|k| DOOR_SCHEMES.contains(&k.as_str())))
                })
            });
            out.push(Operation {
                id: spec["operationId"].as_str().unwrap_or_default().to_owned(),
                method: name.to_ascii_uppercase(),
                filter,
                path: path.clone(),
                access: if door { Access::Door } else { Access::Open },
                spec: spec.clone(),
            });
        }
    }
    out
}

/// What `reference` (`#/components/...`) points to in the document.
pub fn resolve(reference: &str) -> Option<&'static Value> {
    let pointer = reference.strip_prefix('#')?;
    document().pointer(pointer)
}

/// `value`, or what it refers to when it is `{"$ref": …}`.
pub fn deref(value: &Value) -> &Value {
    match value.get("$ref").and_then(Value::as_str) {
        Some(r) => resolve(r).unwrap_or(value),
        None => value,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::http::api::{HANDLERS, handler, try_routes};

    #[test]
    fn the_document_is_openapi_3_1_with_one_id_per_operation() {
        let doc = document();
        assert_eq!(doc["openapi"], "3.1.0");
        let ops = operations();
        assert_eq!(ops.len(), HANDLERS.len(), "one operation per handler");
        let mut ids = std::collections::BTreeSet::new();
        for op in &ops {
            assert!(
                !op.id.is_empty(),
                "{} {} has no operationId",
                op.method,
                op.path
            );
            assert!(ids.insert(op.id.clone()), "`{}` twice", op.id);
            assert!(op.path.starts_with("/api/"), "{}", op.path);
            assert!(op.spec["summary"].is_string(), "`{}` has no summary", op.id);
        }
        // Every reference resolves.
        let text = serde_json::to_string(doc).unwrap();
        for part in text.split("\"$ref\":\"").skip(1) {
            let reference = &part[..part.find('"').unwrap()];
            assert!(
                resolve(reference).is_some(),
                "{reference} resolves to nothing"
            );
        }
    }

    #[test]
    fn the_router_is_built_from_the_document() {
        let (_open, _door) = try_routes().unwrap();
    }

    /// Every request body the document describes: its example, and an object of every
    /// documented property's example, are read by the handler's own type (so a field name
    /// the handler does not know, or one it requires that the document lacks, fails here;
    /// the handlers' types deny unknown fields). The same for query strings.
    #[test]
    fn documented_inputs_are_what_the_handlers_read() {
        for op in operations() {
            let h = handler(&op.id)
                .unwrap_or_else(|| panic!("`{}` has no handler in api::HANDLERS", op.id));
            let content = op
                .spec
                .get("requestBody")
                .map(|b| &deref(b)["content"]["application/json"]);
            match (content, h.body) {
                (None, None) => {}
                (Some(c), Some(check)) => {
                    let schema = deref(&c["schema"]);
                    let props = schema["properties"]
                        .as_object()
                        .unwrap_or_else(|| panic!("`{}`: a body schema without properties", op.id));
                    let mut every = serde_json::Map::new();
                    for (name, prop) in props {
                        let example = prop["examples"][0].clone();
                        assert!(
                            !example.is_null(),
                            "`{}`: property `{name}` has no `examples`",
                            op.id
                        );
                        every.insert(name.clone(), example);
                    }
                    check(&Value::Object(every.clone()))
                        .unwrap_or_else(|e| panic!("`{}`: {every:?} is refused: {e}", op.id));
                    if let Some(example) = c.get("example") {
                        check(example).unwrap_or_else(|e| {
                            panic!("`{}`: the example {example} is refused: {e}", op.id)
                        });
                    }
                    // A field the handler does not know is refused, so the check has teeth.
                    every.insert("not_a_field".into(), Value::from(1));
                    assert!(
                        check(&Value::Object(every)).is_err(),
                        "`{}`: the handler's type accepts unknown fields",
                        op.id
                    );
                }
                (Some(_), None) => panic!("`{}`: documented body, no check in HANDLERS", op.id),
                (None, Some(_)) => panic!("`{}`: a body check, but no body documented", op.id),
            }
            let params: Vec<&Value> = op
                .spec
                .get("parameters")
                .and_then(Value::as_array)
                .map(|ps| {
                    ps.iter()
                        .map(deref)
                        .filter(|p| p["in"] == "query")
                        .collect()
                })
                .unwrap_or_default();
            match (params.is_empty(), h.query) {
                (true, None) => {}
                (false, Some(check)) => {
                    let mut pairs = Vec::new();
                    for p in &params {
                        let name = p["name"].as_str().unwrap();
                        let example = match &p["example"] {
                            Value::String(s) => s.clone(),
                            Value::Null => panic!("`{}`: parameter `{name}` has no example", op.id),
                            other => other.to_string(),
                        };
                        pairs.push(format!("{name}={example}"));
                    }
                    let uri: axum::http::Uri =
                        format!("{}?{}", op.path, pairs.join("&")).parse().unwrap();
                    check(&uri).unwrap_or_else(|e| panic!("`{}`: {uri} is refused: {e}", op.id));
                    let uri: axum::http::Uri =
                        format!("{}?{}&not_a_field=1", op.path, pairs.join("&"))
                            .parse()
                            .unwrap();
                    assert!(
                        check(&uri).is_err(),
                        "`{}`: the handler's query accepts unknown fields",
                        op.id
                    );
                }
                (true, Some(_)) => {
                    panic!("`{}`: a query check, but no parameters documented", op.id)
                }
                (false, None) => panic!("`{}`: documented parameters, no check in HANDLERS", op.id),
            }
        }
    }

    /// Nothing mounts a path under `/api` but `api::routes`: the sources are read, since a
    /// router cannot be asked what it serves.
    #[test]
    fn no_other_file_mounts_an_api_path() {
        // The server's sources (the lab's stand-ins for other products serve their own `/api`).
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/server");
        let mut stack = vec![root];
        let mut offenders = Vec::new();
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                if path.extension().is_none_or(|e| e != "rs") {
                    continue;
                }
                let text = std::fs::read_to_string(&path).unwrap();
                for call in [".route(", ".nest(", ".nest_service(", ".route_service("] {
                    for (at, _) in text.match_indices(call) {
                        let arg = text[at + call.len()..].trim_start();
                        if arg.starts_with("\"/api") {
                            offenders.push(format!(
                                "{}: {call}{}",
                                path.display(),
                                &arg[..arg.len().min(40)]
                            ));
                        }
                    }
                }
            }
        }
        assert!(
            offenders.is_empty(),
            "paths under /api belong in openapi.yaml and api::HANDLERS: {offenders:#?}"
        );
    }
}
