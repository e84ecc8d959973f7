//! A statement assembled from pieces with its parameters, numbered `$1, $2, …` as both engines read them
//! (sqlx's `QueryBuilder` writes `?` for the `Any` driver, which PostgreSQL does not accept).

use sqlx::any::AnyArguments;
use sqlx::query::Query;
use sqlx::Any;

use super::Engine;

/// One parameter value.
#[derive(Debug, Clone)]
pub(crate) enum Bind {
    Text(String),
    Int(i64),
    /// A text column's NULL.
    Null,
}

impl From<Option<&str>> for Bind {
    fn from(text: Option<&str>) -> Bind {
        text.map_or(Bind::Null, |t| Bind::Text(t.to_owned()))
    }
}

/// Rows per multi-row `INSERT` at most: at 12 columns, 1,536 parameters, far under either engine's limit
/// (SQLite 32,766, PostgreSQL 65,535). A power of two, like every chunk.
pub(crate) const ROWS_PER_INSERT: usize = 128;

#[derive(Debug, Default)]
pub(crate) struct Sql {
    text: String,
    binds: Vec<Bind>,
    /// Placeholders written as bare `?` (SQLite only): sqlx looks up each named parameter's name, and SQLite finds
    /// a name by scanning all of them, which made binding a 640-parameter insert quadratic.
    anonymous: bool,
}

impl Sql {
    pub(crate) fn new(text: impl Into<String>) -> Sql {
        Sql { text: text.into(), binds: Vec::new(), anonymous: false }
    }

    pub(crate) fn push(&mut self, text: impl AsRef<str>) -> &mut Sql {
        self.text.push_str(text.as_ref());
        self
    }

    /// Append the next parameter's placeholder and keep its value.
    pub(crate) fn push_bind(&mut self, value: Bind) -> &mut Sql {
        self.binds.push(value);
        if self.anonymous {
            self.text.push('?');
        } else {
            self.text.push('$');
            self.text.push_str(&self.binds.len().to_string());
        }
        self
    }

    pub(crate) fn query(&self) -> Query<'_, Any, AnyArguments<'_>> {
        self.binds.iter().fold(sqlx::query(&self.text), |q, bind| match bind {
            Bind::Text(text) => q.bind(text.as_str()),
            Bind::Int(n) => q.bind(*n),
            Bind::Null => q.bind(None::<&str>),
        })
    }

    /// `head VALUES (…), (…)` for `rows`: one statement (one trip to the database's connection) per chunk instead
    /// of one per row. `bind` gives a row's values in the order of `head`'s columns. Chunks are powers of two up
    /// to [`ROWS_PER_INSERT`] (13 rows go as 8 + 4 + 1), so a table has at most 8 statement shapes, each prepared
    /// once per connection and cached: SQLite compiles a multi-row insert in time linear in its rows, and
    /// compiling one for every batch cost more than the row-by-row trips it saved.
    pub(crate) fn inserts<T>(engine: Engine, head: &str, rows: &[T], bind: impl Fn(&T) -> Vec<Bind>) -> Vec<Sql> {
        let mut chunks = Vec::new();
        let mut rest = rows;
        while !rest.is_empty() {
            let size = rest.len().min(ROWS_PER_INSERT);
            let (chunk, tail) = rest.split_at(1 << size.ilog2());
            chunks.push(chunk);
            rest = tail;
        }
        chunks
            .into_iter()
            .map(|chunk| {
                let mut sql = Sql::new(head);
                sql.anonymous = engine == Engine::Sqlite;
                sql.push(" VALUES ");
                for (i, row) in chunk.iter().enumerate() {
                    sql.push(if i == 0 { "(" } else { ", (" });
                    for (j, value) in bind(row).into_iter().enumerate() {
                        if j > 0 {
                            sql.push(", ");
                        }
                        sql.push_bind(value);
                    }
                    sql.push(")");
                }
                sql
            })
            .collect()
    }
}

/// Run `statements` atomically: alone when there is one (a statement is atomic by itself), else in one
/// transaction.
pub(crate) async fn execute_all(pool: &sqlx::AnyPool, statements: &[Sql]) -> Result<(), sqlx::Error> {
    match statements {
        [] => Ok(()),
        [one] => one.query().execute(pool).await.map(drop),
        many => {
            let mut conn = TxConnection::acquire(pool).await?;
            let mut tx = conn.begin().await?;
            for statement in many {
                statement.query().execute(&mut *tx).await?;
            }
            tx.commit().await?;
            conn.done();
            Ok(())
        }
    }
}

/// A pooled connection for one transaction: returned to the pool once [`TxConnection::done`] says the transaction
/// committed, closed otherwise (an error returned early, a future dropped midway).
///
/// When SQLite ends a transaction itself (a full disk, an I/O error, a trigger's `RAISE(ROLLBACK)`), sqlx's
/// ROLLBACK then fails and it goes on counting the connection as inside one: its next transaction there is a
/// `SAVEPOINT`, and a rollback of that one leaves a real transaction open for good. That connection then held the
/// database's write lock, every other write waited out its busy timeout and failed, and what it wrote itself was
/// never committed, so events the satellite counted as kept were lost (found with a disk full for a few seconds).
/// A connection whose transaction did not commit is never used again.
pub(crate) struct TxConnection(Option<sqlx::pool::PoolConnection<Any>>);

impl TxConnection {
    pub(crate) async fn acquire(pool: &sqlx::AnyPool) -> Result<Self, sqlx::Error> {
        Ok(Self(Some(pool.acquire().await?)))
    }

    /// Begin the transaction (the connection is always there until `done` or drop).
    pub(crate) async fn begin(&mut self) -> Result<sqlx::Transaction<'_, Any>, sqlx::Error> {
        let conn = self.0.as_mut().ok_or(sqlx::Error::PoolClosed)?;
        sqlx::Connection::begin(&mut **conn).await
    }

    /// The transaction committed: the connection goes back to the pool.
    pub(crate) fn done(mut self) {
        drop(self.0.take());
    }
}

impl Drop for TxConnection {
    fn drop(&mut self) {
        // Detached, the pool opens a new connection in its place; dropped, this one closes (and SQLite rolls back
        // whatever it still holds).
        if let Some(conn) = self.0.take() {
            drop(conn.detach());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_numbered_in_order() {
        let mut sql = Sql::new("SELECT 1 WHERE a = ");
        sql.push_bind(Bind::Text("x".into())).push(" AND b = ").push_bind(Bind::Int(2));
        assert_eq!(sql.text, "SELECT 1 WHERE a = $1 AND b = $2");
        assert_eq!(sql.binds.len(), 2);
    }

    #[test]
    fn inserts_number_every_row_in_chunks_of_powers_of_two() {
        let rows: Vec<i64> = (0..2 * ROWS_PER_INSERT as i64 + 13).collect();
        let statements =
            Sql::inserts(Engine::Postgres, "INSERT INTO t (a, b)", &rows, |n| vec![Bind::Int(*n), Bind::Null]);
        let sizes: Vec<usize> = statements.iter().map(|s| s.binds.len() / 2).collect();
        assert_eq!(sizes, [ROWS_PER_INSERT, ROWS_PER_INSERT, 8, 4, 1]);
        assert!(statements[0].text.starts_with("INSERT INTO t (a, b) VALUES ($1, $2), ($3, $4)"));
        assert!(matches!(statements[1].binds[0], Bind::Int(n) if n == ROWS_PER_INSERT as i64), "rows stay in order");
        assert_eq!(statements[4].text, "INSERT INTO t (a, b) VALUES ($1, $2)");
        assert!(Sql::inserts(Engine::Postgres, "INSERT INTO t (a)", &[] as &[i64], |n| vec![Bind::Int(*n)]).is_empty());
        let sqlite =
            Sql::inserts(Engine::Sqlite, "INSERT INTO t (a, b)", &rows[..2], |n| vec![Bind::Int(*n), Bind::Null]);
        assert_eq!(sqlite[0].text, "INSERT INTO t (a, b) VALUES (?, ?), (?, ?)", "SQLite binds by position");
    }
}
