//! A statement assembled from pieces with its parameters, numbered `$1, $2, …` as both engines read them
//! (sqlx's `QueryBuilder` writes `?` for the `Any` driver, which PostgreSQL does not accept).

use sqlx::any::AnyArguments;
use sqlx::query::Query;
use sqlx::Any;

/// One parameter value.
#[derive(Debug, Clone)]
pub(crate) enum Bind {
    Text(String),
    Int(i64),
}

#[derive(Debug, Default)]
pub(crate) struct Sql {
    text: String,
    binds: Vec<Bind>,
}

impl Sql {
    pub(crate) fn new(text: impl Into<String>) -> Sql {
        Sql { text: text.into(), binds: Vec::new() }
    }

    pub(crate) fn push(&mut self, text: impl AsRef<str>) -> &mut Sql {
        self.text.push_str(text.as_ref());
        self
    }

    /// Append the next parameter's placeholder and keep its value.
    pub(crate) fn push_bind(&mut self, value: Bind) -> &mut Sql {
        self.binds.push(value);
        self.text.push('$');
        self.text.push_str(&self.binds.len().to_string());
        self
    }

    pub(crate) fn query(&self) -> Query<'_, Any, AnyArguments<'_>> {
        self.binds.iter().fold(sqlx::query(&self.text), |q, bind| match bind {
            Bind::Text(text) => q.bind(text.as_str()),
            Bind::Int(n) => q.bind(*n),
        })
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
}
