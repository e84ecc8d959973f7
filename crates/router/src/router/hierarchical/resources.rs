//! The hierarchical router's resources: `list_mcp_resources`, `read_mcp_resource`, and resources listed and
//! read natively on `/mcp`, each under its server's namespace.

use super::*;

impl HierarchicalRouter {
    /// Read `uri` on the caller's instance that has it. `outer`: the request that asks (`resources/read`, or the
    /// `tools/call` of `read_mcp_resource`), whose `_meta` goes with the read: its progress token above all, so
    /// the server's progress reaches the client that asked.
    pub(super) async fn read(
        &self,
        caller: &Principal,
        uri: &str,
        outer: &Value,
        relay: Option<&Relay>,
    ) -> Result<Payload, RouteError> {
        let (instance, original) = self.resolve_resource(caller, uri)?;
        let slug = instance.spec().server_slug.clone();
        if !callable(instance.state()) {
            return Err(internal(format!("MCP server '{slug}' is unavailable (status: {})", instance.state())));
        }
        let mut params = protocol::object([("uri", Value::from(original))]);
        if let Some(meta) = outer.get("_meta").filter(|m| !m.is_null()) {
            params["_meta"] = meta.clone();
        }
        forward(&self.manager, &instance, "resources/read", params, self.read_timeout, relay).await
    }

    /// The caller's instance and original URI a resource URI names, in any of its public forms: the original
    /// URI (when one of the caller's servers has it), `satellite://{slug}/{encoded}` (when several do), or the
    /// meta-tools' `slug|uri`.
    pub(in crate::router) fn resolve_resource(
        &self,
        caller: &Principal,
        uri: &str,
    ) -> Result<(Arc<Instance>, String), RouteError> {
        let not_found = || {
            RouteError::Rpc(
                RpcError::new(codes::INVALID_PARAMS, format!("Resource not found: {uri}"))
                    .with_data(json!({"uri": uri})),
            )
        };
        let knows = |instance: &Instance, original: &str| {
            instance.catalog().is_some_and(|c| {
                c.resources.iter().any(|r| r.uri == original)
                    || c.templates.iter().any(|t| template_matches(&t.uri_template, original))
            })
        };
        if let Some((slug, original)) = parse_shared_uri(uri) {
            let instance = self.instance_for(caller, slug)?;
            return if knows(&instance, &original) { Ok((instance, original)) } else { Err(not_found()) };
        }
        let mine = self.visible_instances(caller);
        let listing: Vec<&Arc<Instance>> =
            mine.iter().filter(|i| i.catalog().is_some_and(|c| c.resources.iter().any(|r| r.uri == uri))).collect();
        match listing.as_slice() {
            [one] => return Ok(((*one).clone(), uri.to_owned())),
            [] => {}
            several => {
                let choices: Vec<String> = several.iter().map(|i| shared_uri(&i.spec().server_slug, uri)).collect();
                return Err(invalid(format!(
                    "Resource {uri} exists on several of your servers; read one of: {}",
                    choices.join(", ")
                )));
            }
        }
        if let Some((slug, original)) = parse_namespaced_uri(uri) {
            if !mine.iter().any(|i| knows(i, uri)) {
                let instance = self.instance_for(caller, slug)?;
                return if knows(&instance, original) { Ok((instance, original.to_owned())) } else { Err(not_found()) };
            }
        }
        // A URI one of the caller's servers' templates produces.
        mine.into_iter().rev().find(|i| knows(i, uri)).map(|i| (i, uri.to_owned())).ok_or_else(not_found)
    }

    pub(super) fn resource_entries(&self, caller: &Principal) -> Vec<Value> {
        let mut out = Vec::new();
        for instance in self.visible_instances(caller) {
            let slug = &instance.spec().server_slug;
            for resource in instance.catalog().iter().flat_map(|c| c.resources.clone()) {
                let d = &resource.definition;
                let mut entry = json!({
                    "uri": namespaced_uri(slug, &resource.uri),
                    "name": d.get("name").cloned().unwrap_or(Value::Null),
                    "description": d.get("description").cloned().unwrap_or(Value::Null),
                    "mimeType": d.get("mimeType").cloned().unwrap_or(Value::Null),
                    "server": slug,
                });
                if let Some(meta) = d.get("_meta") {
                    entry["_meta"] = namespace_ui_meta(meta, slug);
                }
                out.push(entry);
            }
        }
        out
    }

    pub(super) fn template_entries(&self, caller: &Principal) -> Vec<Value> {
        let mut out = Vec::new();
        for instance in self.visible_instances(caller) {
            let slug = &instance.spec().server_slug;
            for template in instance.catalog().iter().flat_map(|c| c.templates.clone()) {
                let d = &template.definition;
                out.push(json!({
                    "uri_template": namespaced_uri(slug, &template.uri_template),
                    "name": d.get("name").cloned().unwrap_or(Value::Null),
                    "description": d.get("description").cloned().unwrap_or(Value::Null),
                    "mimeType": d.get("mimeType").cloned().unwrap_or(Value::Null),
                    "server": slug,
                }));
            }
        }
        out
    }

    /// Native `resources/list`: namespaced URIs, names prefixed with the slug (SB §13.6).
    /// `resources/list` on `/mcp`: each resource under its original URI when it is the only one of the caller's
    /// with that URI, else under its `satellite://` form; the server's slug in `_meta`.
    pub(super) fn native_resources(&self, caller: &Principal) -> Vec<Value> {
        let all: Vec<(String, ResourceDef)> = self
            .visible_instances(caller)
            .into_iter()
            .flat_map(|i| {
                let slug = i.spec().server_slug.clone();
                i.catalog().into_iter().flat_map(move |c| {
                    c.resources.clone().into_iter().map({
                        let slug = slug.clone();
                        move |r| (slug.clone(), r)
                    })
                })
            })
            .collect();
        let mut seen: HashMap<&str, usize> = HashMap::new();
        for (_, resource) in &all {
            *seen.entry(resource.uri.as_str()).or_default() += 1;
        }
        all.iter()
            .map(|(slug, resource)| {
                let public = if seen[resource.uri.as_str()] == 1 {
                    resource.uri.clone()
                } else {
                    shared_uri(slug, &resource.uri)
                };
                native_entry(&resource.definition, slug, "uri", &public)
            })
            .collect()
    }

    /// `resources/templates/list` on `/mcp`: templates keep their own form (URIs they produce are read as is).
    pub(super) fn native_templates(&self, caller: &Principal) -> Vec<Value> {
        let mut out = Vec::new();
        for instance in self.visible_instances(caller) {
            let slug = &instance.spec().server_slug;
            for template in instance.catalog().iter().flat_map(|c| c.templates.clone()) {
                out.push(native_entry(&template.definition, slug, "uriTemplate", &template.uri_template));
            }
        }
        out
    }
}

fn native_entry(definition: &Value, slug: &str, key: &str, namespaced: &str) -> Value {
    let mut entry = definition.clone();
    if let Value::Object(map) = &mut entry {
        map.insert(key.into(), json!(namespaced));
        let name = map.get("name").and_then(Value::as_str).unwrap_or_default().to_owned();
        map.insert("name".into(), json!(format!("[{slug}] {name}")));
        let mut meta = map.get("_meta").cloned().filter(Value::is_object).unwrap_or_else(|| json!({}));
        meta[SERVER_META_KEY] = json!(slug);
        map.insert("_meta".into(), meta);
    }
    entry
}

/// Whether a URI could come from an RFC 6570 template (literal parts in order; `{…}` matches anything).
fn template_matches(template: &str, uri: &str) -> bool {
    let mut rest = uri;
    let mut parts = template.split('{').peekable();
    let Some(first) = parts.next() else { return false };
    let Some(after) = rest.strip_prefix(first) else { return false };
    rest = after;
    for part in parts {
        let literal = part.split_once('}').map(|(_, lit)| lit).unwrap_or("");
        if literal.is_empty() {
            continue;
        }
        match rest.find(literal) {
            Some(pos) => rest = &rest[pos + literal.len()..],
            None => return false,
        }
    }
    template.ends_with('}') || rest.is_empty()
}

/// `read_mcp_resource`'s text: contents joined by newlines, binaries described (SB §13.5).
pub(super) fn join_contents(result: &Value) -> String {
    let Some(contents) = result.get("contents").and_then(Value::as_array) else {
        return serde_json::to_string_pretty(result).unwrap_or_default();
    };
    contents
        .iter()
        .map(|item| {
            if let Some(text) = item.get("text").and_then(Value::as_str) {
                text.to_owned()
            } else if let Some(blob) = item.get("blob").and_then(Value::as_str) {
                let mime = item.get("mimeType").and_then(Value::as_str).unwrap_or("unknown");
                format!("[Binary content, {} chars base64, mimeType: {mime}]", blob.len())
            } else {
                item.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_match_their_expansions() {
        assert!(template_matches("demo://items/{id}", "demo://items/42"));
        assert!(!template_matches("demo://items/{id}", "demo://other/42"));
        assert!(template_matches("file:///{path}", "file:///a/b.txt"));
        assert!(template_matches("db://{table}/rows/{id}.json", "db://users/rows/7.json"));
        assert!(!template_matches("db://{table}/rows/{id}.json", "db://users/rows/7.xml"));
    }

    #[test]
    fn contents_are_joined_and_binaries_described() {
        let result = json!({"contents": [{"text": "a"}, {"blob": "AAAA", "mimeType": "image/png"}, {"uri": "x"}]});
        assert_eq!(join_contents(&result), "a\n[Binary content, 4 chars base64, mimeType: image/png]\n{\"uri\":\"x\"}");
    }
}
