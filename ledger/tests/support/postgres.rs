//! PostgreSQL databases of their own for test trials and benchmarks, on the server named by
//! `LIFEBOAT_TEST_DATABASE_URL` (whose role needs CREATEDB).

use sqlx::Executor;

/// Creates the database `name` afresh (dropping a leftover of an earlier run) and returns the
/// URL of it on the same server with the same credentials.
pub async fn create_database(admin_url: &str, name: &str) -> Result<String, String> {
    let admin = sqlx::PgPool::connect(admin_url)
        .await
        .map_err(|e| format!("PostgreSQL at LIFEBOAT_TEST_DATABASE_URL is not reachable: {e}"))?;
    for sql in [
        format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"),
        format!("CREATE DATABASE \"{name}\""),
    ] {
        admin
            .execute(sqlx::AssertSqlSafe(sql))
            .await
            .map_err(|e| format!("creating database {name}: {e}"))?;
    }
    admin.close().await;
    Ok(with_database(admin_url, name))
}

/// Drops the database `name`, best effort (the server may be gone already).
pub async fn drop_database(admin_url: &str, name: &str) {
    if let Ok(admin) = sqlx::PgPool::connect(admin_url).await {
        let sql = format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)");
        let _ = admin.execute(sqlx::AssertSqlSafe(sql)).await;
        admin.close().await;
    }
}

/// `url` with its database (the path) replaced by `database`.
fn with_database(url: &str, database: &str) -> String {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let server = match base[authority_start..].find('/') {
        Some(slash) => &base[..authority_start + slash],
        None => base,
    };
    match query {
        Some(query) => format!("{server}/{database}?{query}"),
        None => format!("{server}/{database}"),
    }
}
