//! Choosing clusters among the feasible ones by spread constraints (Karmada's
//! `SelectBestClusters`): `cluster` picks the best `maxGroups` clusters by score and needs at
//! least `minGroups`; `region` picks regions within its limits, the best cluster of each, then
//! fills up to the cluster `maxGroups` with the next best clusters of the chosen regions.

use crate::request::{GroupLimits, SpreadRules};

/// A feasible cluster, as selection sees it. Callers pass them best first (score descending,
/// then name ascending).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Choice<'a> {
    pub name: &'a str,
    pub score: i64,
    pub available: i64,
    pub region: Option<&'a str>,
}

/// Spread constraints that cannot be met.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SelectFailure {
    TooFewClusters {
        feasible: usize,
        min: usize,
    },
    TooFewRegions {
        feasible: usize,
        min: usize,
    },
    /// The cluster `maxGroups` is lower than the region `minGroups`.
    Conflict {
        max_clusters: usize,
        min_regions: usize,
    },
}

impl SelectFailure {
    /// Karmada's wording, for counting clusters alike.
    pub fn summary(&self) -> String {
        match self {
            SelectFailure::TooFewClusters { feasible, min } => format!(
                "cluster(s) were feasible, {feasible} in all, fewer than spreadConstraint minGroups {min}"
            ),
            SelectFailure::TooFewRegions { feasible, min } => format!(
                "cluster(s) were feasible, in {feasible} region(s), fewer than the region spreadConstraint minGroups {min}"
            ),
            SelectFailure::Conflict {
                max_clusters,
                min_regions,
            } => format!(
                "cluster(s) were feasible, but the cluster spreadConstraint maxGroups {max_clusters} is lower than the region minGroups {min_regions}"
            ),
        }
    }
}

/// Indices into `choices` of the selected clusters. `need` (Divided by available replicas):
/// when the best `maxGroups` clusters cannot run that many replicas together, the lowest
/// scored picks are swapped for unpicked clusters that can run more.
pub fn select(
    choices: &[Choice<'_>],
    rules: &SpreadRules,
    need: Option<i64>,
) -> Result<Vec<usize>, SelectFailure> {
    let cluster = rules.cluster.unwrap_or(GroupLimits { min: 1, max: None });
    if rules.region.is_some() {
        return by_region(choices, rules, cluster);
    }
    if rules.cluster.is_none() {
        return Ok((0..choices.len()).collect());
    }
    if choices.len() < cluster.min {
        return Err(SelectFailure::TooFewClusters {
            feasible: choices.len(),
            min: cluster.min,
        });
    }
    let take = cluster.max.unwrap_or(choices.len()).min(choices.len());
    let mut picked: Vec<usize> = (0..take).collect();
    if let Some(need) = need {
        swap_for_room(choices, &mut picked, need);
    }
    Ok(picked)
}

fn swap_for_room(choices: &[Choice<'_>], picked: &mut [usize], need: i64) {
    let room = |picked: &[usize]| {
        picked
            .iter()
            .map(|&i| choices[i].available)
            .fold(0i64, i64::saturating_add)
    };
    let mut spare: Vec<usize> = (0..choices.len()).filter(|i| !picked.contains(i)).collect();
    // Most room first; ties keep the score order.
    spare.sort_by(|&a, &b| {
        choices[b]
            .available
            .cmp(&choices[a].available)
            .then(a.cmp(&b))
    });
    for candidate in spare {
        if room(picked) >= need {
            break;
        }
        // Replace the lowest scored pick that has less room than the candidate.
        let Some(pos) = (0..picked.len())
            .rev()
            .find(|&p| choices[picked[p]].available < choices[candidate].available)
        else {
            break;
        };
        picked[pos] = candidate;
    }
    picked.sort_unstable();
}

fn by_region(
    choices: &[Choice<'_>],
    rules: &SpreadRules,
    cluster: GroupLimits,
) -> Result<Vec<usize>, SelectFailure> {
    let region = rules.region.unwrap_or(GroupLimits { min: 1, max: None });
    // Regions in order of their best cluster (choices are best first), then total room.
    let mut regions: Vec<(&str, Vec<usize>, i64)> = Vec::new();
    for (i, c) in choices.iter().enumerate() {
        let Some(name) = c.region else { continue };
        match regions.iter_mut().find(|(r, _, _)| *r == name) {
            Some((_, members, room)) => {
                members.push(i);
                *room = room.saturating_add(c.available);
            }
            None => regions.push((name, vec![i], c.available)),
        }
    }
    regions.sort_by(|a, b| {
        let best = |r: &(&str, Vec<usize>, i64)| choices[r.1[0]].score;
        best(b).cmp(&best(a)).then(b.2.cmp(&a.2)).then(a.0.cmp(b.0))
    });
    if regions.len() < region.min {
        return Err(SelectFailure::TooFewRegions {
            feasible: regions.len(),
            min: region.min,
        });
    }
    let max_clusters = cluster.max.unwrap_or(usize::MAX);
    let chosen = region
        .max
        .unwrap_or(regions.len())
        .min(regions.len())
        .min(max_clusters);
    if chosen < region.min {
        return Err(SelectFailure::Conflict {
            max_clusters,
            min_regions: region.min,
        });
    }
    let mut picked: Vec<usize> = regions[..chosen].iter().map(|r| r.1[0]).collect();
    let mut rest: Vec<usize> = regions[..chosen]
        .iter()
        .flat_map(|r| r.1[1..].iter().copied())
        .collect();
    rest.sort_unstable();
    for i in rest {
        if picked.len() >= max_clusters {
            break;
        }
        picked.push(i);
    }
    if picked.len() < cluster.min {
        return Err(SelectFailure::TooFewClusters {
            feasible: picked.len(),
            min: cluster.min,
        });
    }
    picked.sort_unstable();
    Ok(picked)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::selector::ClusterField;

    fn c<'a>(name: &'a str, score: i64, available: i64, region: &'a str) -> Choice<'a> {
        Choice {
            name,
            score,
            available,
            region: Some(region),
        }
    }

    fn limits(min: usize, max: Option<usize>) -> Option<GroupLimits> {
        Some(GroupLimits { min, max })
    }

    fn names<'a>(choices: &[Choice<'a>], picked: &[usize]) -> Vec<&'a str> {
        picked.iter().map(|&i| choices[i].name).collect()
    }

    #[test]
    fn by_cluster_takes_the_best_max_groups() {
        let choices = [
            c("a", 300, 1, "r1"),
            c("b", 200, 1, "r1"),
            c("c", 100, 50, "r2"),
        ];
        let rules = SpreadRules {
            cluster: limits(1, Some(2)),
            ..Default::default()
        };
        assert_eq!(
            names(&choices, &select(&choices, &rules, None).unwrap()),
            ["a", "b"]
        );
        // Divided needing 10 replicas: b is swapped for c, which has room.
        assert_eq!(
            names(&choices, &select(&choices, &rules, Some(10)).unwrap()),
            ["a", "c"]
        );
        let strict = SpreadRules {
            cluster: limits(4, None),
            ..Default::default()
        };
        assert_eq!(
            select(&choices, &strict, None),
            Err(SelectFailure::TooFewClusters {
                feasible: 3,
                min: 4
            })
        );
        assert_eq!(
            select(&choices, &SpreadRules::default(), None).unwrap(),
            [0, 1, 2]
        );
    }

    #[test]
    fn by_region_takes_the_best_cluster_per_region_then_fills() {
        let choices = [
            c("eu-1", 300, 1, "eu"),
            c("eu-2", 250, 1, "eu"),
            c("us-1", 200, 1, "us"),
            c("ap-1", 100, 1, "ap"),
            c("us-2", 50, 1, "us"),
        ];
        let rules = SpreadRules {
            cluster: limits(2, Some(3)),
            region: limits(2, Some(2)),
            required_fields: vec![ClusterField::Region],
        };
        // Regions eu and us; best of each (eu-1, us-1), then the next best in them (eu-2).
        assert_eq!(
            names(&choices, &select(&choices, &rules, None).unwrap()),
            ["eu-1", "eu-2", "us-1"]
        );
        let three_regions = SpreadRules {
            cluster: limits(1, Some(3)),
            region: limits(3, None),
            ..rules.clone()
        };
        assert_eq!(
            names(&choices, &select(&choices, &three_regions, None).unwrap()),
            ["eu-1", "us-1", "ap-1"]
        );
        let four_regions = SpreadRules {
            region: limits(4, None),
            ..rules.clone()
        };
        assert_eq!(
            select(&choices, &four_regions, None),
            Err(SelectFailure::TooFewRegions {
                feasible: 3,
                min: 4
            })
        );
        let conflict = SpreadRules {
            cluster: limits(1, Some(1)),
            region: limits(2, None),
            ..rules
        };
        assert_eq!(
            select(&choices, &conflict, None),
            Err(SelectFailure::Conflict {
                max_clusters: 1,
                min_regions: 2
            })
        );
    }
}
