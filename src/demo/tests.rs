use super::*;

fn meta(version: &str) -> Value {
    json!({"io.modelcontextprotocol/protocolVersion": version, "io.modelcontextprotocol/clientCapabilities": {}})
}

async fn call(server: &DemoServer, method: &str, params: Value, session: &Session) -> Value {
    match server.handle(json!({"jsonrpc":"2.0","id":1,"method":method,"params":params}), session).await {
        Reply::Response(v) | Reply::Initialized { response: v, .. } => v,
        Reply::Nothing => Value::Null,
    }
}

#[tokio::test]
async fn legacy_only_refuses_discover_and_needs_initialize() {
    let server = DemoServer::demo(ProtocolSupport::Legacy, None);
    let fresh = Session::default();
    let r = call(&server, "server/discover", json!({"_meta": meta(MODERN_VERSION)}), &fresh).await;
    assert_eq!(r["error"]["code"], codes::METHOD_NOT_FOUND);
    let r = call(&server, "tools/list", json!({}), &fresh).await;
    assert_eq!(r["error"]["code"], codes::INVALID_REQUEST);
    let r = call(&server, "initialize", json!({"protocolVersion": "2025-06-18"}), &fresh).await;
    assert_eq!(r["result"]["protocolVersion"], "2025-06-18");
    let ready = Session { initialized: true, version: Some("2025-06-18".into()) };
    let r = call(&server, "tools/list", json!({}), &ready).await;
    assert_eq!(r["result"]["tools"].as_array().unwrap().len(), 7);
}

#[tokio::test]
async fn modern_requests_are_validated_and_stamped() {
    let server = DemoServer::demo(ProtocolSupport::Modern, Some(3));
    let none = Session::default();
    let r = call(&server, "initialize", json!({"protocolVersion": "2025-06-18"}), &none).await;
    assert_eq!(r["error"]["code"], codes::METHOD_NOT_FOUND);
    let r = call(&server, "server/discover", json!({"_meta": meta(MODERN_VERSION)}), &none).await;
    assert_eq!(r["result"]["supportedVersions"], json!([MODERN_VERSION]));
    assert_eq!(r["result"]["_meta"][meta_keys::SERVER_INFO]["name"], "satellite-demo");
    let r = call(&server, "tools/list", json!({"_meta": meta("1900-01-01")}), &none).await;
    assert_eq!(r["error"]["code"], codes::UNSUPPORTED_PROTOCOL_VERSION);
    assert_eq!(r["error"]["data"]["requested"], "1900-01-01");
    let r = call(&server, "tools/list", json!({}), &none).await;
    assert_eq!(r["error"]["code"], codes::INVALID_PARAMS);
    let r = call(&server, "tools/list", json!({"_meta": meta(MODERN_VERSION)}), &none).await;
    assert_eq!(r["result"]["tools"].as_array().unwrap().len(), 3);
    assert_eq!(r["result"]["nextCursor"], "3");
    assert_eq!(r["result"]["resultType"], "complete");
    let r = call(
        &server,
        "tools/call",
        json!({"name": "add", "arguments": {"a": 2, "b": 3}, "_meta": meta(MODERN_VERSION)}),
        &none,
    )
    .await;
    assert_eq!(r["result"]["structuredContent"]["sum"], 5.0);
}

#[tokio::test]
async fn resources_and_tool_errors() {
    let server = DemoServer::demo(ProtocolSupport::Both, None);
    let ready = Session { initialized: true, version: Some("2025-11-25".into()) };
    let r = call(&server, "resources/read", json!({"uri": UI_RESOURCE_URI}), &ready).await;
    assert!(r["result"]["contents"][0]["text"].as_str().unwrap().contains("Demo app"));
    let r = call(&server, "resources/read", json!({"uri": "demo://nope"}), &ready).await;
    assert_eq!(r["error"]["code"], -32002);
    let r = call(&server, "tools/call", json!({"name": "fail"}), &ready).await;
    assert_eq!(r["result"]["isError"], true);
    let r = call(&server, "tools/call", json!({"name": "echo", "arguments": {"text": 1}}), &ready).await;
    assert_eq!(r["error"]["code"], codes::INVALID_PARAMS);
}
