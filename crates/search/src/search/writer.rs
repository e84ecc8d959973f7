//! The index's one writer task: the commands it is sent, how it applies them under one commit, and how it
//! merges the index and lets go of its writer once idle.

use std::sync::Arc;

use tantivy::indexer::IndexWriterOptions;
use tantivy::{Index, IndexReader, IndexWriter, TantivyDocument, TantivyError, Term};
use tokio::sync::{mpsc, watch};

use super::schema::IndexSchema;
use super::ToolDoc;

/// At most this many queued commands are applied under one commit.
const MAX_COMMANDS_PER_COMMIT: usize = 256;

/// Indexing memory of the single writer thread (tantivy's minimum is 15 MB).
const WRITER_MEMORY_BYTES: usize = 15 * 1024 * 1024;

/// After a commit, segments are merged into one once no write has come for this long.
const MERGE_WHEN_IDLE: std::time::Duration = std::time::Duration::from_millis(500);

/// What the writer publishes after each commit.
#[derive(Clone, Default)]
pub(super) struct Applied {
    /// The number of the last command applied.
    pub(super) through: u64,
    /// The last commit that failed: the number of its last command and the error. Kept, so that
    /// [`SearchIndex::written`](super::SearchIndex::written) can tell a caller that a write it sent earlier was
    /// lost.
    pub(super) failed: Option<(u64, Arc<str>)>,
}

/// Replace every document of `process_id` by `tools` (none: remove the instance).
pub(super) struct Command {
    /// Its place in the order of commands (`Progress`).
    pub(super) number: u64,
    pub(super) process_id: String,
    pub(super) tools: Tools,
}

/// The tools of one write, made into documents on the writer's thread one at a time as they are added. An
/// instance's listing of thousands of tools is then never held as thousands of strings and documents at once
/// on the caller's thread, where they left the allocator's pages stretched long after they were freed.
pub(super) type Tools = Box<dyn Iterator<Item = ToolDoc> + Send>;

/// A document as the writer's queue holds it: boxed. tantivy's queue is a channel of 10,000 slots
/// (`PIPELINE_MAX_SIZE_IN_DOCS`), allocated and written whole when the writer is made and again at every
/// commit; a slot holds up to four documents inline, so boxing them makes the queue 0.8 MB instead of 2.5 MB.
pub(super) struct QueuedDocument(Box<TantivyDocument>);

impl tantivy::Document for QueuedDocument {
    type Value<'a> = <TantivyDocument as tantivy::Document>::Value<'a>;
    type FieldsValuesIter<'a> = <TantivyDocument as tantivy::Document>::FieldsValuesIter<'a>;

    fn iter_fields_and_values(&self) -> Self::FieldsValuesIter<'_> {
        self.0.iter_fields_and_values()
    }
}

pub(super) type Writer = IndexWriter<QueuedDocument>;

/// The index's writer: one indexing thread, one merge thread (a merge of a few thousand tools takes
/// milliseconds), the minimum indexing memory.
pub(super) fn open_writer(index: &Index) -> Result<Writer, TantivyError> {
    let options = IndexWriterOptions::builder()
        .num_worker_threads(1)
        .num_merge_threads(1)
        .memory_budget_per_thread(WRITER_MEMORY_BYTES)
        .build();
    index.writer_with_options(options)
}

/// The writer task: the only owner of the `IndexWriter`. Once no command has come for [`MERGE_WHEN_IDLE`]
/// after a commit, it merges every segment into one: each query pays a setup per (term, segment), so a
/// few large segments answer several times faster than the many small ones that one commit per
/// instance change leaves behind, while a burst of changes is never held up by merges.
///
/// Once merged, the writer is dropped until the next command: it holds tantivy's document queue (10,000
/// slots, 0.8 MB, allocated whole and made again at every commit) and three threads, while an idle index
/// needs none of them. Opening a writer again costs well under a millisecond, against a commit's several.
pub(super) async fn run_writer(
    index: Index,
    writer: Writer,
    reader: IndexReader,
    schema: Arc<IndexSchema>,
    mut commands: mpsc::Receiver<Command>,
    applied: watch::Sender<Applied>,
) {
    let mut task = WriterTask { index, writer: Some(writer), reader, schema, applied, unmerged: false };
    loop {
        // `None`: no write came for MERGE_WHEN_IDLE after a commit, so it is time to merge.
        let next = if task.unmerged {
            tokio::time::timeout(MERGE_WHEN_IDLE, commands.recv()).await.ok()
        } else {
            Some(commands.recv().await)
        };
        let going_on = match next {
            Some(Some(first)) => task.commit(next_batch(first, &mut commands)).await,
            Some(None) => return,
            None => task.merge().await,
        };
        if !going_on {
            return;
        }
    }
}

/// `first` and the commands queued behind it, at most [`MAX_COMMANDS_PER_COMMIT`] in all.
fn next_batch(first: Command, commands: &mut mpsc::Receiver<Command>) -> Vec<Command> {
    let mut batch = vec![first];
    while batch.len() < MAX_COMMANDS_PER_COMMIT {
        match commands.try_recv() {
            Ok(command) => batch.push(command),
            Err(_) => break,
        }
    }
    batch
}

/// What the writer task holds from one command to the next.
struct WriterTask {
    index: Index,
    /// `None` once the merged index has let go of it, or when one could not be opened.
    writer: Option<Writer>,
    reader: IndexReader,
    schema: Arc<IndexSchema>,
    applied: watch::Sender<Applied>,
    /// A commit has come since the last merge.
    unmerged: bool,
}

impl WriterTask {
    /// Merges every segment into one on the blocking pool and drops the writer; `false` when the writer
    /// panicked, which ends the task.
    async fn merge(&mut self) -> bool {
        let Some(open) = self.writer.take() else {
            self.unmerged = false;
            return true;
        };
        let reader = self.reader.clone();
        // Merged, the writer is dropped there (its drop joins its indexing thread); kept on a failure,
        // which is typically a segment tantivy's own merge policy is merging now: tried again later.
        let merged = tokio::task::spawn_blocking(move || {
            let mut open = open;
            merge_all(&mut open, &reader).err().map(|error| (open, error))
        })
        .await;
        match merged {
            Ok(None) => self.unmerged = false,
            Ok(Some((kept, error))) => {
                tracing::debug!(%error, "search index merge postponed");
                self.writer = Some(kept);
            }
            Err(error) => {
                tracing::error!(%error, "search index writer panicked; the index is now read-only");
                return false;
            }
        }
        true
    }

    /// Applies `batch` under one commit and publishes the number of its last command; `false` when the writer
    /// panicked, which ends the task.
    async fn commit(&mut self, batch: Vec<Command>) -> bool {
        let last = batch.iter().map(|command| command.number).max().unwrap_or_default();
        let mut changes = Vec::with_capacity(batch.len());
        let mut instances = Vec::with_capacity(batch.len());
        for Command { process_id, tools, .. } in batch {
            changes.push((Term::from_field_text(self.schema.fields.process_id, &process_id), tools));
            instances.push(process_id);
        }
        let (reader, schema) = (self.reader.clone(), self.schema.clone());
        // On a panic the task ends, dropping `applied`: waiting searches go on with what the index holds.
        let work = move |w: &mut Writer| apply(w, &reader, &schema, changes);
        let Some((returned, result)) = on_blocking_pool(self.writer.take(), self.index.clone(), work).await else {
            return false;
        };
        self.writer = returned;
        let failed = match result {
            Ok(()) => None,
            Err(error) => {
                tracing::warn!(%error, instances = ?instances, "search index commit failed; these instances' tools are not searchable until they are indexed again");
                Some((last, Arc::from(error.to_string())))
            }
        };
        self.unmerged = true;
        self.applied.send_modify(|applied| {
            applied.through = last;
            if failed.is_some() {
                applied.failed = failed;
            }
        });
        true
    }
}

/// Runs `work` on the writer on the blocking pool, opening one first if there is none, and hands the writer
/// back (none if it could not be opened: the next command tries again); `None` (logged) when it panicked,
/// after which the index stays read-only.
async fn on_blocking_pool(
    writer: Option<Writer>,
    index: Index,
    work: impl FnOnce(&mut Writer) -> Result<(), TantivyError> + Send + 'static,
) -> Option<(Option<Writer>, Result<(), TantivyError>)> {
    match tokio::task::spawn_blocking(move || {
        let mut writer = match writer {
            Some(writer) => writer,
            None => match open_writer(&index) {
                Ok(writer) => writer,
                Err(error) => return (None, Err(error)),
            },
        };
        let result = work(&mut writer);
        (Some(writer), result)
    })
    .await
    {
        Ok(done) => Some(done),
        Err(error) => {
            tracing::error!(%error, "search index writer panicked; the index is now read-only");
            None
        }
    }
}

/// Merges every searchable segment into one and reloads the reader, which also picks up what tantivy's own
/// merge policy merged in the background since the last commit (the reader reloads only when told).
fn merge_all(writer: &mut Writer, reader: &IndexReader) -> Result<(), TantivyError> {
    let segments = writer.index().searchable_segment_ids()?;
    if segments.len() > 1 {
        writer.merge(&segments).wait()?;
    }
    reader.reload()
}

/// Applies deletes and adds in order, commits, reloads the reader; rolls back on failure.
fn apply(
    writer: &mut Writer,
    reader: &IndexReader,
    schema: &IndexSchema,
    changes: Vec<(Term, Tools)>,
) -> Result<(), TantivyError> {
    if let Err(error) = write_and_commit(writer, schema, changes) {
        if let Err(rollback_error) = writer.rollback() {
            tracing::warn!(%rollback_error, "search index rollback failed");
        }
        return Err(error);
    }
    reader.reload()
}

fn write_and_commit(
    writer: &mut Writer,
    schema: &IndexSchema,
    changes: Vec<(Term, Tools)>,
) -> Result<(), TantivyError> {
    for (process_id, tools) in changes {
        #[cfg(test)]
        match process_id.value().as_str() {
            Some(super::tests::FAILS_TO_INDEX) => {
                return Err(TantivyError::InternalError("this process id fails to index (a test's fault)".into()))
            }
            Some(super::tests::STOPS_THE_WRITER) => panic!("this process id stops the writer (a test's fault)"),
            _ => {}
        }
        writer.delete_term(process_id);
        for tool in tools {
            writer.add_document(QueuedDocument(Box::new(schema.document(&tool))))?;
        }
    }
    writer.commit()?;
    Ok(())
}
