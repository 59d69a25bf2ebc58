"""The idleness API over mutual TLS (issue 27, item 5: "bearer token or mTLS from settings"): a real TLS listener of
the service, real certificates made here (a CA, the server's, a client's, and a stranger CA's client), and a real
HTTPS client. No client certificate, or one another CA signed: the handshake fails and nothing is answered."""

from __future__ import annotations

import datetime as dt
import json
import ssl
import threading
import urllib.error
import urllib.request

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gpufinops.config import ConfigError, load_settings
from tests.run.test_fleet_api import TOKEN, make
from tests.run.test_service import free_port

NOW = dt.datetime.now(dt.timezone.utc)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn), x509.NameAttribute(NameOID.ORGANIZATION_NAME, "t")])


def _cert(subject: str, issuer_key, issuer: x509.Name, *, ip: str | None = None):
    """A leaf certificate for `subject`, signed by `issuer_key` as `issuer`."""
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(issuer)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(NOW - dt.timedelta(hours=1)).not_valid_after(NOW + dt.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True))
    if ip:
        import ipaddress

        builder = builder.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))]),
                                        critical=False)
    return key, builder.sign(issuer_key, hashes.SHA256())


def _write(folder, name, key, cert) -> tuple[str, str]:
    c, k = folder / f"{name}.crt", folder / f"{name}.key"
    c.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    k.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()))
    return str(c), str(k)


@pytest.fixture
def pki(tmp_path):
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(_name("test-ca")).issuer_name(_name("test-ca"))
          .public_key(ca_key.public_key()).serial_number(1).not_valid_before(NOW - dt.timedelta(hours=1))
          .not_valid_after(NOW + dt.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True).sign(ca_key, hashes.SHA256()))
    ca_file, _ = _write(tmp_path, "ca", ca_key, ca)
    server = _write(tmp_path, "server", *_cert("gpufinops", ca_key, ca.subject, ip="127.0.0.1"))
    client = _write(tmp_path, "client", *_cert("skypilot", ca_key, ca.subject))
    other_key = ec.generate_private_key(ec.SECP256R1())
    stranger = _write(tmp_path, "stranger", *_cert("eve", other_key, _name("other-ca")))
    return {"ca": ca_file, "server": server, "client": client, "stranger": stranger}


def serve(tmp_path, pki, **api):
    tls = {"port": free_port(), "cert_file": pki["server"][0], "key_file": pki["server"][1],
           "client_ca_file": pki["ca"]}
    service, _clock, http, _base = make(tmp_path, tls=tls, **api)
    https = service.mutual_tls_server()
    threading.Thread(target=https.serve_forever, daemon=True).start()
    service.evaluate_job()
    return service, http, https, f"https://127.0.0.1:{tls['port']}/v1/verdicts?instance=i-idle1"


def get(url, pki, client=None, token=None):
    context = ssl.create_default_context(cafile=pki["ca"])
    if client:
        context.load_cert_chain(*pki[client])
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=5, context=context) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_a_client_certificate_of_the_ca_is_the_access_and_others_get_no_answer(tmp_path, pki, caplog):
    service, http, https, url = serve(tmp_path, pki)
    try:
        status, body = get(url, pki, client="client")
        assert status == 200 and body["instances"][0]["verdict"] == "IDLE"  # not loopback-only: TLS verified it
        for client in (None, "stranger"):  # no certificate; a certificate another CA signed
            with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
                get(url, pki, client=client)
        assert "api (mutual TLS): refused 127.0.0.1" in caplog.text and "Traceback" not in caplog.text
        # The plain port still answers only loopback without a token (what it always did) and /metrics.
        assert get(url.replace("https", "http").replace(str(https.server_address[1]),
                                                         str(http.server_address[1])), pki)[0] == 200
    finally:
        https.shutdown()
        http.shutdown()


def test_with_a_token_set_the_certificate_alone_is_not_enough(tmp_path, pki, monkeypatch):
    monkeypatch.setenv("GPUFINOPS_API_TOKEN", TOKEN)
    service, http, https, url = serve(tmp_path, pki)
    try:
        assert get(url, pki, client="client")[0] == 401
        assert get(url, pki, client="client", token="wrong")[0] == 401
        status, body = get(url, pki, client="client", token=TOKEN)
        assert status == 200 and body["instances"][0]["instance_id"] == "i-idle1"
    finally:
        https.shutdown()
        http.shutdown()


def test_tls_settings_are_checked_at_load(tmp_path, pki):
    good = {"port": 9443, "cert_file": pki["server"][0], "key_file": pki["server"][1], "client_ca_file": pki["ca"]}
    assert load_settings(api={"tls": good}).api.tls.port == 9443
    with pytest.raises(ConfigError, match=r"api\.tls\.client_ca_file.*not a file"):
        load_settings(api={"tls": {**good, "client_ca_file": str(tmp_path / "missing.pem")}})
    with pytest.raises(ConfigError, match=r"api\.tls\.port 9108 is service\.port too"):
        load_settings(api={"tls": {**good, "port": 9108}})
