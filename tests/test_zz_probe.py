from __future__ import annotations
import json
from typing import Any
import pytest
from tests.test_state_endpoint import ops, _bearer, BASE, TOKEN  # noqa

def show(r):
    print(r.status_code, r.content[:300])

def test_probe(ops, client):
    show(client.post(BASE + "slow/reset", data=json.dumps({"key": "ip:1.2.3.4"}), content_type="application/json", **_bearer()))
    show(client.post(BASE + "slow/drain", data=json.dumps({"key": "ip:1.2.3.4"}), content_type="application/json", **_bearer()))
    show(client.post(BASE + "per_ip/drain", data=json.dumps({"key": "1.2.3.4"}), content_type="application/json", **_bearer()))
    show(client.get(BASE + "?name=", **_bearer()))
    show(client.get(BASE + "?name=ratelimiter:", **_bearer()))
    show(client.get(BASE, HTTP_AUTHORIZATION="Bearer \u20ac"))
    show(client.get(BASE, HTTP_AUTHORIZATION="Bearer  " + TOKEN + " "))
    show(client.post(BASE + "acquirer/transition", data=json.dumps({"to": "x"*100000}), content_type="application/json", **_bearer()))
    show(client.post(BASE + "acquirer/transition", data="to=open&to=", content_type="application/x-www-form-urlencoded", **_bearer()))
    show(client.post(BASE + "acquirer/transition", data=json.dumps({"to": "open\x00"}), content_type="application/json", **_bearer()))
    show(client.post(BASE + "per_ip/reset", data=json.dumps({"key": "ip:1.2.3.4", "timeout": 1e400}), content_type="application/json", **_bearer()))
    show(client.post(BASE + "per_ip/reset", data=b'{"key": "\\ud800"}', content_type="application/json", **_bearer()))
    show(client.post(BASE + "per_ip/reset", data=b'{"key": "a"}', content_type="application/json; charset=latin-1", **_bearer()))
    show(client.post(BASE + "per_ip/reset", data=b'\xff\xfe{', content_type="application/json", **_bearer()))
    show(client.get(BASE + "?name=%00", **_bearer()))
    show(client.get(BASE + "?keys=1&cluster=1", **_bearer()))
