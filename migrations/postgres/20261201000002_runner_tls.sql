-- The fingerprint (sha256:<hex>) of the certificate a joined runner serves, sent when it
-- joined; the server pins it and calls no runner that presents another certificate.
-- NULL for a runner that joined over plain HTTP (insecure_http) or sent none.
ALTER TABLE runners ADD COLUMN tls_fingerprint TEXT;
