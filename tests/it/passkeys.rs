//! Passkey registration in the portal (`/api/passkeys`), both backends, with a software
//! authenticator written here (a P-256 key that builds attestation objects in the "none"
//! format and assertions, as a browser's platform authenticator would): a registration
//! stores the key the runners will verify with; hostile registrations are refused (a
//! replayed challenge, another session's challenge, a wrong origin, someone else's
//! credential id, a credential registered already, an expired challenge, a missing CSRF
//! token, a person who does not approve); people see and remove only their own passkeys; a
//! passkey signature whose signature counter does not grow (a cloned authenticator) is
//! refused.

use aws_lc_rs::signature::{ECDSA_P256_SHA256_ASN1_SIGNING, EcdsaKeyPair, KeyPair};
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use ciborium::value::Value as Cbor;
use emisar::protocol::approval::webauthn::{self, Assertion, PasskeyPublic, RelyingParty};
use emisar::server::audit::AuditFilter;
use emisar::server::config::WebauthnConfig;
use emisar::server::principal::Role;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::approvals::{Portal, call_in_background, signed_in, wait_for_pending};
use crate::both_backends;
use crate::harness::app::{Options, TestApp};
use crate::harness::{Backend, spawn_app};

const RP_ID: &str = "emisar.example.com";
const ORIGIN: &str = "https://emisar.example.com";

/// A passkey authenticator in software: one P-256 credential.
pub struct SoftAuthenticator {
    key: EcdsaKeyPair,
    pub credential_id: Vec<u8>,
}

impl SoftAuthenticator {
    pub fn new() -> Self {
        let rng = aws_lc_rs::rand::SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).unwrap();
        let mut credential_id = vec![0u8; 32];
        getrandom::fill(&mut credential_id).unwrap();
        SoftAuthenticator {
            key: EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref()).unwrap(),
            credential_id,
        }
    }

    /// The same key claiming another credential id.
    pub fn claiming(mut self, credential_id: Vec<u8>) -> Self {
        self.credential_id = credential_id;
        self
    }

    /// The public key as SubjectPublicKeyInfo DER (what `/api/passkeys` lists and approvers
    /// files carry): the fixed P-256 header, then the uncompressed point.
    pub fn spki(&self) -> Vec<u8> {
        let mut der = hex::decode("3059301306072a8648ce3d020106082a8648ce3d030107034200").unwrap();
        der.extend_from_slice(self.key.public_key().as_ref());
        der
    }

    fn cose_key(&self) -> Vec<u8> {
        let point = self.key.public_key().as_ref();
        let map = Cbor::Map(vec![
            (Cbor::from(1), Cbor::from(2)),
            (Cbor::from(3), Cbor::from(-7)),
            (Cbor::from(-1), Cbor::from(1)),
            (Cbor::from(-2), Cbor::Bytes(point[1..33].to_vec())),
            (Cbor::from(-3), Cbor::Bytes(point[33..65].to_vec())),
        ]);
        let mut out = Vec::new();
        ciborium::into_writer(&map, &mut out).unwrap();
        out
    }

    /// rpIdHash, flags UP|UV (and AT with the credential when `attested`), signCount.
    fn authenticator_data(&self, rp_id: &str, attested: bool, sign_count: u32) -> Vec<u8> {
        let mut d = Sha256::digest(rp_id.as_bytes()).to_vec();
        d.push(if attested { 0x45 } else { 0x05 });
        d.extend_from_slice(&sign_count.to_be_bytes());
        if attested {
            d.extend_from_slice(&[0; 16]);
            d.extend_from_slice(&(self.credential_id.len() as u16).to_be_bytes());
            d.extend_from_slice(&self.credential_id);
            d.extend_from_slice(&self.cose_key());
        }
        d
    }

    /// What `navigator.credentials.create` gives the page, as the finish route takes it, from
    /// an authenticator that keeps no signature counter.
    pub fn create(&self, challenge: &[u8], origin: &str, name: &str) -> Value {
        self.create_counted(challenge, origin, name, 0)
    }

    /// The same from an authenticator whose signature counter stands at `sign_count`.
    pub fn create_counted(
        &self,
        challenge: &[u8],
        origin: &str,
        name: &str,
        sign_count: u32,
    ) -> Value {
        let client_data = client_data("webauthn.create", challenge, origin);
        let map = Cbor::Map(vec![
            (Cbor::from("fmt"), Cbor::from("none")),
            (Cbor::from("attStmt"), Cbor::Map(vec![])),
            (
                Cbor::from("authData"),
                Cbor::Bytes(self.authenticator_data(RP_ID, true, sign_count)),
            ),
        ]);
        let mut attestation = Vec::new();
        ciborium::into_writer(&map, &mut attestation).unwrap();
        json!({
            "name": name,
            "credential_id": URL_SAFE_NO_PAD.encode(&self.credential_id),
            "attestation_object": URL_SAFE_NO_PAD.encode(attestation),
            "client_data_json": URL_SAFE_NO_PAD.encode(client_data),
        })
    }

    /// What `navigator.credentials.get` gives the page, for `challenge`, from an
    /// authenticator that keeps no signature counter.
    pub fn get(&self, challenge: &[u8], origin: &str) -> Assertion {
        self.get_counted(challenge, origin, 0)
    }

    /// The same with the signature counter at `sign_count` (a real authenticator counts up
    /// by itself; a clone of it counts from where it was copied).
    pub fn get_counted(&self, challenge: &[u8], origin: &str, sign_count: u32) -> Assertion {
        let client_data = client_data("webauthn.get", challenge, origin);
        let authenticator_data = self.authenticator_data(RP_ID, false, sign_count);
        let mut signed = authenticator_data.clone();
        signed.extend_from_slice(&Sha256::digest(&client_data));
        let rng = aws_lc_rs::rand::SystemRandom::new();
        Assertion {
            credential_id: self.credential_id.clone(),
            signature: self.key.sign(&rng, &signed).unwrap().as_ref().to_vec(),
            authenticator_data,
            client_data_json: client_data,
        }
    }
}

fn client_data(ty: &str, challenge: &[u8], origin: &str) -> Vec<u8> {
    json!({"type": ty, "challenge": URL_SAFE_NO_PAD.encode(challenge), "origin": origin, "crossOrigin": false})
        .to_string()
        .into_bytes()
}

async fn with_passkeys(backend: Backend) -> TestApp {
    spawn_app(
        backend,
        vec![],
        Options {
            webauthn: Some(WebauthnConfig {
                rp_id: Some(RP_ID.into()),
                origins: vec![ORIGIN.into()],
            }),
            ..Default::default()
        },
    )
    .await
}

/// Starts a registration: the creation options, and the challenge's bytes.
async fn start(portal: &Portal) -> (Value, Vec<u8>) {
    let (status, body) = portal
        .post("/api/passkeys/register/start", json!({}), true)
        .await;
    assert_eq!(status, 200, "{body}");
    let challenge = URL_SAFE_NO_PAD
        .decode(body["publicKey"]["challenge"].as_str().unwrap())
        .unwrap();
    (body, challenge)
}

async fn finish(portal: &Portal, body: Value) -> (u16, Value) {
    portal
        .post("/api/passkeys/register/finish", body, true)
        .await
}

fn error(body: &Value) -> &str {
    body["error"].as_str().unwrap_or_default()
}

async fn a_passkey_registers_and_its_stored_key_verifies_assertions(backend: Backend) {
    let app = with_passkeys(backend).await;
    let carol = signed_in(&app, "carol", Role::Approver).await;
    let (options, challenge) = start(&carol).await;
    let pk = &options["publicKey"];
    assert_eq!(challenge.len(), 32, "{options}");
    assert_eq!(pk["rp"]["id"], RP_ID, "{options}");
    assert_eq!(pk["user"]["name"], "carol", "{options}");
    assert_eq!(pk["authenticatorSelection"]["userVerification"], "required");
    assert_eq!(pk["attestation"], "none");
    let algs: Vec<i64> = pk["pubKeyCredParams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["alg"].as_i64().unwrap())
        .collect();
    assert_eq!(algs, [-7, -8]);
    assert_eq!(pk["excludeCredentials"], json!([]));

    let authenticator = SoftAuthenticator::new();
    let (status, stored) = finish(&carol, authenticator.create(&challenge, ORIGIN, "laptop")).await;
    assert_eq!(status, 200, "{stored}");
    assert_eq!(stored["alg"], "ES256");
    assert_eq!(stored["user"], "carol");
    assert_eq!(stored["name"], "laptop");
    let credential_id = URL_SAFE_NO_PAD.encode(&authenticator.credential_id);
    assert_eq!(stored["credential_id"], credential_id.as_str());

    // The list shows it with what an approvers file needs, and the relying party.
    let (status, list) = carol.get("/api/passkeys").await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(list["passkeys"].as_array().unwrap().len(), 1, "{list}");
    assert_eq!(list["webauthn"]["rp_id"], RP_ID);
    assert_eq!(list["webauthn"]["origins"], json!([ORIGIN]));
    // The key as stored verifies what the authenticator signs, as a runner would check it.
    let key = PasskeyPublic {
        credential_id: authenticator.credential_id.clone(),
        alg: webauthn::CoseAlg::ES256,
        public_key: STANDARD
            .decode(list["passkeys"][0]["public_key"].as_str().unwrap())
            .unwrap(),
    };
    let rp = RelyingParty {
        rp_id: RP_ID.into(),
        origins: vec![ORIGIN.into()],
    };
    let statement_hash = [5u8; 32];
    webauthn::verify_assertion(
        &rp,
        &key,
        &statement_hash,
        &authenticator.get(&statement_hash, ORIGIN),
    )
    .unwrap();
    // A second registration excludes the first credential.
    let (options, _) = start(&carol).await;
    assert_eq!(
        options["publicKey"]["excludeCredentials"][0]["id"],
        credential_id.as_str()
    );

    // Audited, with the credential and the key's digest.
    let events = app
        .events(AuditFilter {
            kind: Some("passkey.registered".into()),
            ..Default::default()
        })
        .await;
    assert_eq!(events.len(), 1, "{events:?}");
    let detail = events[0].detail.as_ref().unwrap();
    assert_eq!(events[0].actor, "approver:carol");
    assert_eq!(detail["credential_id"], credential_id.as_str());
    assert_eq!(
        detail["public_key_sha256"],
        hex::encode(Sha256::digest(&key.public_key)).as_str()
    );
    app.assert_chain_intact().await;
}
both_backends!(a_passkey_registers_and_its_stored_key_verifies_assertions);

async fn hostile_registrations_are_refused(backend: Backend) {
    let app = with_passkeys(backend).await;
    let carol = signed_in(&app, "carol", Role::Approver).await;
    let dave = signed_in(&app, "dave", Role::Admin).await;
    let authenticator = SoftAuthenticator::new();

    // Another session's challenge: Dave's session has its own, and Carol's is not it.
    let (_, carols) = start(&carol).await;
    let _ = start(&dave).await;
    let (status, body) = finish(&dave, authenticator.create(&carols, ORIGIN, "stolen")).await;
    assert_eq!(status, 400, "{body}");
    assert!(error(&body).contains("clientDataJSON.challenge"), "{body}");
    // A session that started nothing has no challenge at all.
    let eve = signed_in(&app, "eve", Role::Approver).await;
    let (status, body) = finish(&eve, authenticator.create(&carols, ORIGIN, "stolen")).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        error(&body).contains("no passkey registration is under way"),
        "{body}"
    );

    // Carol herself in another session (another browser): the challenge is her first
    // session's, not hers wherever she is signed in.
    let carol_elsewhere = Portal::login(&app, "carol", "carol-correct-horse-battery").await;
    let (status, body) = finish(
        &carol_elsewhere,
        authenticator.create(&carols, ORIGIN, "stolen"),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        error(&body).contains("no passkey registration is under way"),
        "{body}"
    );

    // Carol's own challenge was untouched by those, and works once.
    let good = authenticator.create(&carols, ORIGIN, "laptop");
    let (status, body) = finish(&carol, good.clone()).await;
    assert_eq!(status, 200, "{body}");
    // Replayed: the challenge is used up.
    let (status, body) = finish(&carol, good).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        error(&body).contains("no passkey registration is under way"),
        "{body}"
    );

    // A wrong origin; and the failed attempt used the challenge up as well.
    let other = SoftAuthenticator::new();
    let (_, challenge) = start(&carol).await;
    let (status, body) = finish(
        &carol,
        other.create(&challenge, "https://evil.example.com", "x"),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(error(&body).contains("clientDataJSON.origin"), "{body}");
    let (status, body) = finish(&carol, other.create(&challenge, ORIGIN, "x")).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        error(&body).contains("no passkey registration is under way"),
        "{body}"
    );

    // Someone else's credential id, named in the request while attesting one's own.
    let (_, challenge) = start(&dave).await;
    let mut claim = other.create(&challenge, ORIGIN, "x");
    claim["credential_id"] = json!(URL_SAFE_NO_PAD.encode(&authenticator.credential_id));
    let (status, body) = finish(&dave, claim).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        error(&body).contains("`credential_id` must be the credential"),
        "{body}"
    );

    // Carol's credential id, attested by another key: the credential is registered already.
    let (_, challenge) = start(&dave).await;
    let squatter = SoftAuthenticator::new().claiming(authenticator.credential_id.clone());
    let (status, body) = finish(&dave, squatter.create(&challenge, ORIGIN, "x")).await;
    assert_eq!(status, 409, "{body}");
    assert!(error(&body).contains("registered already"), "{body}");

    // An expired challenge.
    let (_, challenge) = start(&dave).await;
    let past = emisar::server::audit::format_at(chrono::Utc::now() - chrono::Duration::seconds(1));
    emisar::with_pool!(&app.db, pool => sqlx::query(app.db.sql("UPDATE passkey_challenges SET expires_at = $1::timestamptz"))
        .bind(&past).execute(pool).await.map(|_| ())).unwrap();
    let (status, body) = finish(&dave, other.create(&challenge, ORIGIN, "x")).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        error(&body).contains("no passkey registration is under way"),
        "{body}"
    );

    // Without the session's CSRF token, neither step happens.
    let (status, body) = carol
        .post("/api/passkeys/register/start", json!({}), false)
        .await;
    assert_eq!(status, 403, "{body}");
    assert!(error(&body).contains("CSRF"), "{body}");

    // People who do not approve register no passkeys.
    let frank = signed_in(&app, "frank", Role::Auditor).await;
    let (status, body) = frank
        .post("/api/passkeys/register/start", json!({}), true)
        .await;
    assert_eq!(status, 403, "{body}");
    assert!(error(&body).contains("approver or admin"), "{body}");

    // Only Carol's one passkey was stored, and only its registration audited.
    let (_, list) = dave.get("/api/passkeys?user=carol").await;
    assert_eq!(list["passkeys"].as_array().unwrap().len(), 1, "{list}");
    for who in ["dave", "eve"] {
        let (_, list) = dave.get(&format!("/api/passkeys?user={who}")).await;
        assert_eq!(list["passkeys"], json!([]), "{who}: {list}");
    }
    let registered = app
        .events(AuditFilter {
            kind: Some("passkey.registered".into()),
            ..Default::default()
        })
        .await;
    assert_eq!(registered.len(), 1, "{registered:?}");
}
both_backends!(hostile_registrations_are_refused);

async fn people_see_and_remove_only_their_own_passkeys(backend: Backend) {
    let app = with_passkeys(backend).await;
    let carol = signed_in(&app, "carol", Role::Approver).await;
    let eve = signed_in(&app, "eve", Role::Approver).await;
    let admin = signed_in(&app, "dave", Role::Admin).await;
    let (_, challenge) = start(&carol).await;
    let (status, stored) = finish(
        &carol,
        SoftAuthenticator::new().create(&challenge, ORIGIN, "laptop"),
    )
    .await;
    assert_eq!(status, 200, "{stored}");
    let id = stored["id"].as_str().unwrap().to_owned();

    // Eve neither lists nor removes Carol's passkeys.
    let (status, body) = eve.get("/api/passkeys?user=carol").await;
    assert_eq!(status, 403, "{body}");
    let (status, body) = delete(&eve, &id).await;
    assert_eq!(status, 404, "{body}");
    let (status, body) = delete(&eve, "not-a-uuid").await;
    assert_eq!(status, 400, "{body}");
    let (_, list) = carol.get("/api/passkeys").await;
    assert_eq!(list["passkeys"].as_array().unwrap().len(), 1, "{list}");

    // Carol removes her own; an admin sees and could remove anyone's.
    let (status, list) = admin.get("/api/passkeys?user=carol").await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(list["passkeys"][0]["id"], id.as_str());
    let (status, body) = delete(&carol, &id).await;
    assert_eq!(status, 200, "{body}");
    let (_, list) = carol.get("/api/passkeys").await;
    assert_eq!(list["passkeys"], json!([]), "{list}");
    let removed = app
        .events(AuditFilter {
            kind: Some("passkey.removed".into()),
            ..Default::default()
        })
        .await;
    assert_eq!(removed.len(), 1, "{removed:?}");
    assert_eq!(removed[0].actor, "approver:carol");
    assert_eq!(removed[0].detail.as_ref().unwrap()["passkey"], id.as_str());
}
both_backends!(people_see_and_remove_only_their_own_passkeys);

async fn delete(portal: &Portal, id: &str) -> (u16, Value) {
    let res = reqwest::Client::new()
        .delete(format!("{}/api/passkeys/{id}", portal.base))
        .header("cookie", &portal.cookie)
        .header("x-csrf-token", &portal.csrf)
        .send()
        .await
        .unwrap();
    (res.status().as_u16(), res.json().await.unwrap())
}

/// Without `[webauthn]` or `public_url` the server cannot know its relying party: it says
/// so to whoever tries to register, naming the settings.
async fn without_a_relying_party_registration_says_what_to_set(backend: Backend) {
    let app = spawn_app(backend, vec![], Options::default()).await;
    let carol = signed_in(&app, "carol", Role::Approver).await;
    let (status, body) = carol
        .post("/api/passkeys/register/start", json!({}), true)
        .await;
    assert_eq!(status, 409, "{body}");
    assert!(
        error(&body).contains("webauthn.rp_id") && error(&body).contains("public_url"),
        "{body}"
    );
}
both_backends!(without_a_relying_party_registration_says_what_to_set);

/// A passkey vote on an approval request: the statement's SHA-256 signed by `authenticator`
/// with its signature counter at `sign_count`, posted by `portal`.
async fn passkey_vote(
    portal: &Portal,
    id: &str,
    authenticator: &SoftAuthenticator,
    sign_count: u32,
) -> (u16, Value) {
    let (status, request) = portal.get(&format!("/api/approvals/{id}")).await;
    assert_eq!(status, 200, "{request}");
    let text = request["statement"]["text"].as_str().unwrap();
    let hash = emisar::protocol::approval::statement::hash_text(text);
    let a = authenticator.get_counted(&hash, ORIGIN, sign_count);
    let b64 = |bytes: &[u8]| URL_SAFE_NO_PAD.encode(bytes);
    let signature = json!({
        "kind": "webauthn",
        "signer": "carol",
        "credential_id": b64(&a.credential_id),
        "authenticator_data": b64(&a.authenticator_data),
        "client_data_json": b64(&a.client_data_json),
        "signature": b64(&a.signature),
    });
    portal
        .post(
            &format!("/api/approvals/{id}/approve"),
            json!({"signature": signature}),
            true,
        )
        .await
}

/// WebAuthn L3 §7.2's signCount step (issue 45): the server remembers each credential's
/// signature counter, from the one its registration reported, and refuses a passkey
/// signature whose counter does not grow past it (the authenticator was cloned, or an old
/// assertion is replayed under a new statement's signature, which cannot verify anyway):
/// clearly, audited, nothing run; the real authenticator, counting on, still approves.
async fn a_passkey_signature_whose_counter_does_not_grow_is_refused(backend: Backend) {
    let authenticator = SoftAuthenticator::new();
    let bin = tempfile::tempdir().unwrap();
    let record = crate::approvals::systemctl_standin(bin.path());
    let approvers = bin.path().join("approvers.toml");
    std::fs::write(
        &approvers,
        format!(
            "serial = 1\n[webauthn]\nrp_id = \"{RP_ID}\"\norigins = [\"{ORIGIN}\"]\n\
             [[person]]\nname = \"carol\"\npasskeys = [{{ id = \"{}\", alg = \"ES256\", public_key = \"{}\" }}]\n\
             [[rule]]\ntools = \"*\"\napprovals = 1\n",
            URL_SAFE_NO_PAD.encode(&authenticator.credential_id),
            STANDARD.encode(authenticator.spki()),
        ),
    )
    .unwrap();
    let app = crate::approvals::restart_app(
        backend,
        bin.path(),
        Options {
            webauthn: Some(WebauthnConfig {
                rp_id: Some(RP_ID.into()),
                origins: vec![ORIGIN.into()],
            }),
            approvers_file: Some(approvers),
            ..Default::default()
        },
    )
    .await;
    let carol = signed_in(&app, "carol", Role::Approver).await;
    // Carol registers the passkey in the portal; its authenticator's counter stands at 3.
    let (_, challenge) = start(&carol).await;
    let (status, body) = finish(
        &carol,
        authenticator.create_counted(&challenge, ORIGIN, "laptop", 3),
    )
    .await;
    assert_eq!(status, 200, "{body}");

    let client = app.mcp_client().await;
    let call = call_in_background(
        &client,
        "linux.systemctl_restart",
        crate::approvals::restart_args("consul is wedged"),
    );
    let first = wait_for_pending(&carol).await;
    // Counter 3 again: no more than the registration's. Refused, saying why.
    let (status, body) = passkey_vote(&carol, &first, &authenticator, 3).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        error(&body).contains("authenticatorData.signCount must be greater than the last one seen from this passkey (3), and it is 3")
            && error(&body).contains("cloned"),
        "{body}"
    );
    let (_, row) = carol.get(&format!("/api/approvals/{first}")).await;
    assert_eq!(row["state"], "pending", "{row}");
    assert_eq!(crate::approvals::restarts(&record), 0);
    // The authenticator counts on: 4 approves, and the restart runs.
    let (status, body) = passkey_vote(&carol, &first, &authenticator, 4).await;
    assert_eq!(status, 200, "{body}");
    let res = crate::approvals::finished(call).await;
    assert_eq!(res.is_error, Some(false), "{res:?}");
    assert_eq!(crate::approvals::restarts(&record), 1);

    // A clone copied while the counter stood at 4 signs the next request: 4, then 2, are
    // refused; the real authenticator's 5 is not.
    let call = call_in_background(
        &client,
        "linux.systemctl_restart",
        crate::approvals::restart_args("consul is wedged again"),
    );
    let second = wait_for_pending(&carol).await;
    for replayed in [4, 2] {
        let (status, body) = passkey_vote(&carol, &second, &authenticator, replayed).await;
        assert_eq!(status, 403, "counter {replayed}: {body}");
        assert!(
            error(&body).contains(&format!(
                "the last one seen from this passkey (4), and it is {replayed}"
            )),
            "{body}"
        );
    }
    assert_eq!(crate::approvals::restarts(&record), 1, "nothing more ran");
    let (status, body) = passkey_vote(&carol, &second, &authenticator, 5).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(crate::approvals::finished(call).await.is_error, Some(false));
    assert_eq!(crate::approvals::restarts(&record), 2);

    // Audited: the first refusal as its own event, naming the credential, the person and
    // both counters; carol's repeats in the window counted into one `refusal.repeated`,
    // written at the latest when the server stops.
    let refused = app
        .events(AuditFilter {
            kind: Some("passkey.sign_count_refused".into()),
            ..Default::default()
        })
        .await;
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0].actor, "approver:carol");
    assert_eq!(refused[0].approval_id.as_deref(), Some(first.as_str()));
    assert_eq!(refused[0].outcome.as_deref(), Some("refused"));
    let detail = refused[0].detail.as_ref().unwrap();
    assert_eq!(
        detail["credential_id"],
        URL_SAFE_NO_PAD
            .encode(&authenticator.credential_id)
            .as_str()
    );
    assert_eq!(detail["person"], "carol");
    assert_eq!(detail["stored_sign_count"], 3);
    assert_eq!(detail["asserted_sign_count"], 3);
    client.cancel().await.unwrap();
    let mut app = app;
    app.stop().await;
    let repeated = app
        .events(AuditFilter {
            kind: Some("refusal.repeated".into()),
            ..Default::default()
        })
        .await;
    assert_eq!(repeated.len(), 1, "{repeated:?}");
    let counted = repeated[0].detail.as_ref().unwrap();
    assert_eq!(counted["kind"], "passkey.sign_count_refused");
    assert_eq!(counted["count"], 2, "{counted}");
    assert_eq!(counted["last"]["detail"]["asserted_sign_count"], 2);
    app.assert_chain_intact().await;
}
both_backends!(a_passkey_signature_whose_counter_does_not_grow_is_refused);
