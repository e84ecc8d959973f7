//! The sentence encoder behind the semantic stage: a BERT model (all-MiniLM-L6-v2 and its kind) read from a
//! local directory (`config.json`, `tokenizer.json`, `model.safetensors`), run on the CPU by candle, mean-pooled
//! over the attention mask and L2-normalised, as sentence-transformers does. Nothing is downloaded.
//!
//! A model trained with prompts (the E5 family: "query: " and "passage: ") names them where sentence-transformers
//! keeps them, `config_sentence_transformers.json` (`prompts.query`, and `prompts.passage` or `prompts.document`);
//! each text is embedded with its role's prompt. Without that file texts are embedded as they are.

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
use tokenizers::{PaddingParams, Tokenizer, TruncationParams};

use sha2::{Digest, Sha256};

use super::{Embedder, Role, SemanticError};

pub(super) struct Encoder {
    model: BertModel,
    tokenizer: Tokenizer,
    dimensions: usize,
    /// What is put before a query and before a tool's text.
    prompts: Prompts,
    /// The SHA-256 of the configuration, the tokenizer, the weights' length and the truncation.
    fingerprint: String,
}

impl Encoder {
    /// Loads the model in `dir`; `max_tokens` truncates every text.
    pub(super) fn load(dir: &Path, max_tokens: usize) -> Result<Encoder, SemanticError> {
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read(&path).map_err(|source| SemanticError::Read { path: path.display().to_string(), source })
        };
        let (config_bytes, tokenizer_bytes) = (read("config.json")?, read("tokenizer.json")?);
        let config: serde_json::Value = serde_json::from_slice(&config_bytes)
            .map_err(|error| SemanticError::Model(format!("config.json: {error}")))?;
        let dimensions = config
            .get("hidden_size")
            .and_then(serde_json::Value::as_u64)
            .ok_or_else(|| SemanticError::Model("config.json has no hidden_size".into()))?
            as usize;
        let config: Config =
            serde_json::from_value(config).map_err(|error| SemanticError::Model(format!("config.json: {error}")))?;
        let weights = read("model.safetensors")?;
        let prompts = Prompts::read(dir)?;
        let mut hasher = Sha256::new();
        hasher.update(&config_bytes);
        hasher.update(&tokenizer_bytes);
        if !(prompts.query.is_empty() && prompts.tool.is_empty()) {
            // Only then: a model without prompts keeps the caches it wrote before prompts were read.
            hasher.update(format!("{}\0{}\0", prompts.query, prompts.tool));
        }
        hasher.update((weights.len() as u64).to_le_bytes());
        hasher.update((max_tokens as u64).to_le_bytes());
        let fingerprint = hasher.finalize().iter().map(|b| format!("{b:02x}")).collect();
        let mut tokenizer = Tokenizer::from_bytes(tokenizer_bytes)
            .map_err(|error| SemanticError::Model(format!("tokenizer.json: {error}")))?;
        tokenizer
            .with_truncation(Some(TruncationParams { max_length: max_tokens, ..Default::default() }))
            .map_err(|error| SemanticError::Model(format!("tokenizer truncation: {error}")))?;
        tokenizer.with_padding(Some(PaddingParams::default()));
        let weights = VarBuilder::from_buffered_safetensors(weights, DType::F32, &Device::Cpu)
            .map_err(|error| SemanticError::Model(format!("model.safetensors: {error}")))?;
        let model = BertModel::load(weights, &config).map_err(|error| SemanticError::Model(error.to_string()))?;
        Ok(Encoder { model, tokenizer, dimensions, prompts, fingerprint })
    }
}

/// The prompts a model was trained with, by role.
#[derive(Default)]
struct Prompts {
    query: String,
    tool: String,
}

impl Prompts {
    /// Reads `config_sentence_transformers.json` in `dir`, if there is one. Only the prompts are read; the file's
    /// other settings (versions, similarity function) do not change how texts are embedded here.
    fn read(dir: &Path) -> Result<Prompts, SemanticError> {
        const FILE: &str = "config_sentence_transformers.json";
        let path = dir.join(FILE);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Prompts::default()),
            Err(source) => return Err(SemanticError::Read { path: path.display().to_string(), source }),
        };
        let config: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|error| SemanticError::Model(format!("{FILE}: {error}")))?;
        let prompt = |names: &[&str]| {
            names
                .iter()
                .find_map(|name| config.pointer(&format!("/prompts/{name}")).and_then(serde_json::Value::as_str))
                .unwrap_or_default()
                .to_owned()
        };
        Ok(Prompts { query: prompt(&["query"]), tool: prompt(&["passage", "document"]) })
    }

    fn of(&self, role: Role) -> &str {
        match role {
            Role::Query => &self.query,
            Role::Tool => &self.tool,
        }
    }
}

impl Embedder for Encoder {
    fn dimensions(&self) -> usize {
        self.dimensions
    }

    fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    fn embed(&self, texts: &[String], role: Role) -> Result<Vec<Vec<f32>>, SemanticError> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let prompt = self.prompts.of(role);
        let texts: Vec<String> = texts.iter().map(|text| format!("{prompt}{text}")).collect();
        let encodings = self
            .tokenizer
            .encode_batch(texts, true)
            .map_err(|error| SemanticError::Model(format!("tokenizer: {error}")))?;
        let model = |error: candle_core::Error| SemanticError::Model(error.to_string());
        let rows = |f: fn(&tokenizers::Encoding) -> &[u32]| -> Result<Tensor, SemanticError> {
            let rows = encodings.iter().map(|e| Tensor::new(f(e), &Device::Cpu)).collect::<Result<Vec<_>, _>>();
            Tensor::stack(&rows.map_err(model)?, 0).map_err(model)
        };
        let ids = rows(tokenizers::Encoding::get_ids)?;
        let types = rows(tokenizers::Encoding::get_type_ids)?;
        let mask = rows(tokenizers::Encoding::get_attention_mask)?;
        let output = self.model.forward(&ids, &types, Some(&mask)).map_err(model)?;
        // Mean over the real tokens, then unit length.
        let mask = mask.to_dtype(DType::F32).map_err(model)?.unsqueeze(2).map_err(model)?;
        let summed = output.broadcast_mul(&mask).and_then(|m| m.sum(1)).map_err(model)?;
        let counts = mask.sum(1).map_err(model)?;
        let mean = summed.broadcast_div(&counts).map_err(model)?;
        let norms = mean.sqr().and_then(|s| s.sum_keepdim(1)).and_then(|s| s.sqrt()).map_err(model)?;
        let unit = mean.broadcast_div(&norms).map_err(model)?;
        unit.to_vec2::<f32>().map_err(model)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    fn prompts_in(file: Option<&str>) -> Result<Prompts, SemanticError> {
        let dir = tempfile::tempdir().map_err(|source| SemanticError::Read { path: "tempdir".into(), source })?;
        if let Some(text) = file {
            std::fs::write(dir.path().join("config_sentence_transformers.json"), text)
                .map_err(|source| SemanticError::Read { path: "write".into(), source })?;
        }
        Prompts::read(dir.path())
    }

    #[test]
    fn prompts_are_read_by_role_and_absent_ones_are_empty() -> TestResult {
        let none = prompts_in(None)?;
        assert_eq!((none.of(Role::Query), none.of(Role::Tool)), ("", ""));
        let e5 = prompts_in(Some(r#"{"prompts": {"query": "query: ", "passage": "passage: "}}"#))?;
        assert_eq!((e5.of(Role::Query), e5.of(Role::Tool)), ("query: ", "passage: "));
        // sentence-transformers' other name for the documents' prompt; unknown keys and non-text prompts are
        // passed over rather than refused (MiniLM's file holds only versions).
        let other =
            prompts_in(Some(r#"{"prompts": {"query": 7, "document": "doc: "}, "similarity_fn_name": "cosine"}"#))?;
        assert_eq!((other.of(Role::Query), other.of(Role::Tool)), ("", "doc: "));
        let versions = prompts_in(Some(r#"{"__version__": {"sentence_transformers": "2.0.0"}}"#))?;
        assert_eq!((versions.of(Role::Query), versions.of(Role::Tool)), ("", ""));
        Ok(())
    }

    #[test]
    fn a_prompts_file_caught_half_written_stops_the_load_naming_the_file() {
        let error = prompts_in(Some(r#"{"prompts": {"query": "que"#)).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(error.contains("config_sentence_transformers.json"), "{error}");
    }

    /// A model directory whose weights were cut off mid-copy: the load fails with the file named, no panic.
    #[test]
    fn torn_weights_stop_the_load_naming_the_file() -> TestResult {
        let model = crate::search::semantic::tests::test_model();
        let dir = tempfile::tempdir()?;
        for file in ["config.json", "tokenizer.json"] {
            std::fs::copy(model.join(file), dir.path().join(file))?;
        }
        let weights = std::fs::read(model.join("model.safetensors"))?;
        std::fs::write(dir.path().join("model.safetensors"), &weights[..weights.len() / 2])?;
        let error = Encoder::load(dir.path(), 128).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(error.contains("model.safetensors"), "{error}");
        Ok(())
    }
}
