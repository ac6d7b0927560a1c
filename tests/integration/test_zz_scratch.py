def test_scratch(api):
    bad = []
    for i in range(25):
        sbx = api.create_sandbox(driver="gvisor")
        r = api.post(f"/v1/sandboxes/{sbx.id}/interpreter:run", json={"code": "x = 1\nx"})
        if r.status_code != 200:
            bad.append((i, r.status_code, r.text[:300]))
        api.delete(f"/v1/sandboxes/{sbx.id}")
    print(bad)
