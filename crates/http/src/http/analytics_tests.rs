use super::*;
use crate::model::TeamId;

fn params(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

#[test]
fn a_team_admin_is_held_to_their_team_and_bad_values_are_refused_with_a_reason() {
    let team = || AdminScope::Team(TeamId::from("acme"));
    let q = query(&params(&[]), team()).map_err(|e| e.to_string());
    assert_eq!(q.map(|q| q.filter.team_id), Ok(Some("acme".to_owned())));
    assert!(matches!(query(&params(&[("team_id", "other")]), team()), Err(ApiError::OtherTeam(_))));
    assert!(
        matches!(query(&params(&[("team_id", "other")]), AdminScope::AllTeams), Ok(q) if q.filter.team_id.as_deref() == Some("other"))
    );
    for (name, value) in [("limit", "501"), ("limit", "x"), ("from", "yesterday"), ("bucket", "week"), ("offset", "-1")]
    {
        match query(&params(&[(name, value)]), AdminScope::AllTeams) {
            Err(ApiError::BadQuery(message)) => assert!(message.contains(name), "{message}"),
            _ => panic!("{name}={value} was accepted"),
        }
    }
    let q = query(&params(&[("from", "2026-11-23T10:00:00+01:00")]), AdminScope::AllTeams);
    assert_eq!(q.ok().and_then(|q| q.filter.from), Some("2026-11-23T09:00:00.000Z".to_owned()));
}
