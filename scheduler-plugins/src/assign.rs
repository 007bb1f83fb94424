//! Dividing replicas over the selected clusters: Webster (Sainte-Laguë) apportionment, as
//! Karmada does since v1.16, for static weights, dynamic weights (available replicas) and
//! Aggregated, with Karmada's Steady behaviour on scale up and down.
//!
//! Steady (the default): the clusters keep what they have where they are still selected.
//! Scale up (or replicas lost with a cluster that is no longer selected): only the missing
//! replicas are divided, by the replicas each cluster can still run, and added. Scale down:
//! the new total is divided in proportion to the current assignment, so every cluster shrinks
//! alike. Fresh (after `rescheduleTriggeredAt`): divided from scratch, each cluster's current
//! replicas counted as available to it again. Static weights are always divided from scratch
//! (the result only depends on the weights, so it is stable anyway).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// One cluster taking part in an apportionment. Parties are given in name order: that order
/// breaks exact ties.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Party {
    pub weight: i64,
    /// At most this many seats.
    pub cap: i64,
}

/// The next seat a party would take, ordered so that the party that gets it first is the
/// greatest: highest `weight / (2 × seats + 1)`, then fewer seats, then name order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Claim {
    weight: i64,
    seats: i64,
    position: usize,
    ascending: bool,
}

impl Ord for Claim {
    fn cmp(&self, other: &Claim) -> Ordering {
        let mine = i128::from(self.weight) * (2 * i128::from(other.seats) + 1);
        let theirs = i128::from(other.weight) * (2 * i128::from(self.seats) + 1);
        mine.cmp(&theirs)
            .then_with(|| other.seats.cmp(&self.seats))
            .then_with(|| {
                if self.ascending {
                    other.position.cmp(&self.position)
                } else {
                    self.position.cmp(&other.position)
                }
            })
    }
}

impl PartialOrd for Claim {
    fn partial_cmp(&self, other: &Claim) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Webster / Sainte-Laguë: each next seat goes to the party with the highest
/// `weight / (2 × seats + 1)`; ties go to the party with fewer seats, then to the first
/// (`ascending`) or the last party in name order. Parties with weight 0 or cap 0 get nothing.
/// Returns the seats per party, in the order given; their sum is below `seats` only when the
/// caps do not allow more.
pub fn webster(seats: i64, parties: &[Party], ascending: bool) -> Vec<i64> {
    let eligible = |p: &Party| p.weight > 0 && p.cap > 0;
    let n = parties.iter().filter(|p| eligible(p)).count() as i128;
    let total_weight: i128 = parties
        .iter()
        .filter(|p| eligible(p))
        .map(|p| i128::from(p.weight))
        .sum();
    if n == 0 || seats <= 0 {
        return vec![0; parties.len()];
    }
    // Start from a lower bound of every party's Webster seats: with the final divisor d,
    // seats_i >= floor(w_i / d) and 1/d >= (R - n/2) / W, so floor(w_i (2R - n) / 2W) seats
    // are certainly theirs. Handing out the rest one by one gives exactly the sequential
    // result, in at most about 1.5 n steps instead of R.
    let spare = (2 * i128::from(seats) - n).max(0);
    let mut out: Vec<i64> = parties
        .iter()
        .map(|p| {
            if !eligible(p) {
                return 0;
            }
            let bound = i128::from(p.weight) * spare / (2 * total_weight);
            (bound.min(i128::from(p.cap))) as i64
        })
        .collect();
    let mut remaining = seats - out.iter().sum::<i64>();
    let mut claims: BinaryHeap<Claim> = parties
        .iter()
        .enumerate()
        .filter(|(i, p)| eligible(p) && out[*i] < p.cap)
        .map(|(position, p)| Claim {
            weight: p.weight,
            seats: out[position],
            position,
            ascending,
        })
        .collect();
    while remaining > 0 {
        let Some(mut claim) = claims.pop() else { break };
        claim.seats += 1;
        out[claim.position] = claim.seats;
        remaining -= 1;
        if claim.seats < parties[claim.position].cap {
            claims.push(claim);
        }
    }
    out
}

/// A selected cluster as division sees it. Members are given in name order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member {
    /// Its place by score (0: best); orders equally roomy clusters in Aggregated.
    pub rank: usize,
    /// Replicas it can still run (node by node), on top of what it runs now.
    pub available: i64,
    /// Replicas it has now (0 in Fresh mode is not implied: see `fresh`).
    pub current: i64,
    /// Untolerated NoExecute taint: may keep or lose replicas, never gain.
    pub frozen: bool,
}

/// Not enough room for the replicas.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NotEnough {
    pub available: i64,
    pub needed: i64,
}

/// Static weights: `weights[i]` for `members[i]` (0: not selected).
pub fn by_static_weights(
    replicas: i64,
    members: &[Member],
    weights: &[i64],
    ascending: bool,
) -> Result<Vec<i64>, NotEnough> {
    let parties: Vec<Party> = members
        .iter()
        .zip(weights)
        .map(|(m, &weight)| Party {
            weight,
            cap: if m.frozen { m.current } else { i64::MAX },
        })
        .collect();
    let out = webster(replicas, &parties, ascending);
    check(out, replicas)
}

/// Dynamic weights (available replicas), Steady unless `fresh`.
pub fn by_available_replicas(
    replicas: i64,
    members: &[Member],
    fresh: bool,
    ascending: bool,
) -> Result<Vec<i64>, NotEnough> {
    steady(
        replicas,
        members,
        fresh,
        ascending,
        |delta, members, fresh| {
            let parties = growth_parties(members, fresh);
            let available = parties
                .iter()
                .map(|p| p.cap)
                .fold(0i64, i64::saturating_add);
            if available < delta {
                return Err(NotEnough {
                    available,
                    needed: delta,
                });
            }
            Ok(webster(delta, &parties, ascending))
        },
    )
}

/// Aggregated: as few clusters as possible. Clusters already used come first, then the ones
/// that can run most (ties: by score, then name); the shortest prefix that can run the
/// replicas is divided by what each can run.
pub fn aggregated(
    replicas: i64,
    members: &[Member],
    fresh: bool,
    ascending: bool,
) -> Result<Vec<i64>, NotEnough> {
    steady(
        replicas,
        members,
        fresh,
        ascending,
        |delta, members, fresh| {
            let mut parties = growth_parties(members, fresh);
            let mut order: Vec<usize> = (0..members.len()).collect();
            order.sort_by(|&a, &b| {
                let used = |i: usize| !fresh && members[i].current > 0;
                used(b)
                    .cmp(&used(a))
                    .then(parties[b].cap.cmp(&parties[a].cap))
                    .then(a.cmp(&b))
            });
            let mut sum = 0i64;
            let mut prefix = 0;
            for &i in &order {
                if sum >= delta {
                    break;
                }
                sum = sum.saturating_add(parties[i].cap);
                prefix += 1;
            }
            if sum < delta {
                return Err(NotEnough {
                    available: sum,
                    needed: delta,
                });
            }
            for &i in &order[prefix..] {
                parties[i].cap = 0;
            }
            Ok(webster(delta, &parties, ascending))
        },
    )
}

/// Weights and caps for new replicas: what each member can still run (plus what it runs now
/// in Fresh mode); frozen members take nothing new.
fn growth_parties(members: &[Member], fresh: bool) -> Vec<Party> {
    members
        .iter()
        .map(|m| {
            let room = if m.frozen {
                if fresh { m.current } else { 0 }
            } else if fresh {
                m.available.saturating_add(m.current)
            } else {
                m.available
            };
            Party {
                weight: room,
                cap: room,
            }
        })
        .collect()
}

fn steady(
    replicas: i64,
    members: &[Member],
    fresh: bool,
    ascending: bool,
    grow: impl Fn(i64, &[Member], bool) -> Result<Vec<i64>, NotEnough>,
) -> Result<Vec<i64>, NotEnough> {
    let kept: i64 = if fresh {
        0
    } else {
        members.iter().map(|m| m.current).sum()
    };
    if fresh || kept == 0 {
        return grow(replicas, members, fresh);
    }
    if kept == replicas {
        return Ok(members.iter().map(|m| m.current).collect());
    }
    if kept > replicas {
        // Scale down in proportion to the current assignment.
        let parties: Vec<Party> = members
            .iter()
            .map(|m| Party {
                weight: m.current,
                cap: m.current,
            })
            .collect();
        return check(webster(replicas, &parties, ascending), replicas);
    }
    let added = grow(replicas - kept, members, false)?;
    Ok(members
        .iter()
        .zip(added)
        .map(|(m, a)| m.current + a)
        .collect())
}

fn check(out: Vec<i64>, replicas: i64) -> Result<Vec<i64>, NotEnough> {
    let placed: i64 = out.iter().sum();
    if placed < replicas {
        Err(NotEnough {
            available: placed,
            needed: replicas,
        })
    } else {
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parties in name order (the names only document the examples).
    fn parties(named: &[(&str, i64)]) -> Vec<Party> {
        named
            .iter()
            .map(|&(_, weight)| Party {
                weight,
                cap: i64::MAX,
            })
            .collect()
    }

    /// Whether party `a` takes the next seat before party `b`: the rule, written out plainly.
    fn before(parties: &[Party], seats: &[i64], a: usize, b: usize, ascending: bool) -> bool {
        let pa = i128::from(parties[a].weight) * (2 * i128::from(seats[b]) + 1);
        let pb = i128::from(parties[b].weight) * (2 * i128::from(seats[a]) + 1);
        if pa != pb {
            return pa > pb;
        }
        if seats[a] != seats[b] {
            return seats[a] < seats[b];
        }
        if ascending { a < b } else { a > b }
    }

    /// The plain sequential method, one seat at a time: the reference for the fast one.
    fn sequential(seats: i64, parties: &[Party], ascending: bool) -> Vec<i64> {
        let mut out = vec![0; parties.len()];
        for _ in 0..seats {
            let mut best: Option<usize> = None;
            for i in 0..parties.len() {
                if parties[i].weight <= 0 || out[i] >= parties[i].cap {
                    continue;
                }
                best = Some(match best {
                    Some(b) if !before(parties, &out, i, b, ascending) => b,
                    _ => i,
                });
            }
            if let Some(b) = best {
                out[b] += 1;
            }
        }
        out
    }

    #[test]
    fn karmadas_webster_examples() {
        // Alpha 1200, Beta 900, Gamma 400; 4 seats -> 2, 1, 1.
        let p = parties(&[("Alpha", 1200), ("Beta", 900), ("Gamma", 400)]);
        assert_eq!(webster(4, &p, true), [2, 1, 1]);
        // Wikipedia's Sainte-Laguë example, round by round (Karmada's test). Round 6 is an exact
        // tie between A (100000 / 5) and D (20000 / 1): the scheduler's tie-break (fewer seats
        // first, as Karmada's Dispenser) gives it to D, where the helper's default tie-break
        // (more votes first) gives it to A; every other round is the same.
        let p = parties(&[
            ("PartyA", 100_000),
            ("PartyB", 80_000),
            ("PartyC", 30_000),
            ("PartyD", 20_000),
        ]);
        let rounds = [
            [1, 0, 0, 0],
            [1, 1, 0, 0],
            [2, 1, 0, 0],
            [2, 1, 1, 0],
            [2, 2, 1, 0],
            [2, 2, 1, 1],
            [3, 2, 1, 1],
            [3, 3, 1, 1],
        ];
        for (i, want) in rounds.iter().enumerate() {
            assert_eq!(webster(i as i64 + 1, &p, true), want, "round {}", i + 1);
        }
    }

    #[test]
    fn ties_go_to_fewer_seats_then_by_name_in_the_chosen_direction() {
        let p = parties(&[("a", 1), ("b", 1), ("c", 1)]);
        assert_eq!(webster(1, &p, true), [1, 0, 0]);
        assert_eq!(webster(1, &p, false), [0, 0, 1]);
        assert_eq!(webster(4, &p, true), [2, 1, 1]);
        assert_eq!(webster(4, &p, false), [1, 1, 2]);
    }

    #[test]
    fn the_lower_bound_start_gives_the_sequential_result() {
        let weights: [&[i64]; 5] = [
            &[1, 2],
            &[3, 3, 3],
            &[7, 1, 1, 1, 1, 1, 1, 1],
            &[100_000, 80_000, 30_000, 20_000],
            &[5, 13, 2, 8, 21, 1, 3],
        ];
        for w in weights {
            let p: Vec<Party> = w
                .iter()
                .enumerate()
                .map(|(i, &weight)| Party {
                    weight,
                    cap: if i == 1 { 4 } else { i64::MAX },
                })
                .collect();
            for seats in 0..60 {
                for ascending in [true, false] {
                    assert_eq!(
                        webster(seats, &p, ascending),
                        sequential(seats, &p, ascending),
                        "weights {w:?}, {seats} seats"
                    );
                }
            }
        }
    }

    #[test]
    fn large_replica_counts_are_cheap_and_exact() {
        let p = parties(&[("a", 1), ("b", 2), ("c", 3)]);
        assert_eq!(webster(600_000, &p, true), [100_000, 200_000, 300_000]);
    }

    fn member(rank: usize, available: i64, current: i64) -> Member {
        Member {
            rank,
            available,
            current,
            frozen: false,
        }
    }

    #[test]
    fn static_weights_divide_by_webster() {
        let m = [member(0, 0, 0), member(1, 0, 0), member(2, 0, 0)];
        assert_eq!(
            by_static_weights(10, &m, &[1, 2, 2], true).unwrap(),
            [2, 4, 4]
        );
        assert_eq!(
            by_static_weights(5, &m, &[1, 1, 0], true).unwrap(),
            [3, 2, 0]
        );
        assert_eq!(
            by_static_weights(5, &m, &[1, 1, 0], false).unwrap(),
            [2, 3, 0]
        );
        // A frozen cluster keeps at most what it has.
        let mut frozen = m;
        frozen[0] = Member {
            frozen: true,
            current: 1,
            ..frozen[0]
        };
        assert_eq!(
            by_static_weights(9, &frozen, &[1, 1, 1], true).unwrap(),
            [1, 4, 4]
        );
    }

    #[test]
    fn dynamic_weights_follow_available_replicas() {
        let m = [member(0, 6, 0), member(1, 3, 0), member(2, 1, 0)];
        // The fifth replica: m2 (3 / 3) and m3 (1 / 1) tie, m3 has fewer.
        assert_eq!(
            by_available_replicas(5, &m, false, true).unwrap(),
            [3, 1, 1]
        );
        assert_eq!(
            by_available_replicas(10, &m, false, true).unwrap(),
            [6, 3, 1]
        );
        assert_eq!(
            by_available_replicas(11, &m, false, true),
            Err(NotEnough {
                available: 10,
                needed: 11
            })
        );
    }

    #[test]
    fn steady_scale_up_adds_only_the_missing_replicas() {
        // 4 running on m1, 2 on m2; scale to 10: the 4 new ones by room (m2 has more).
        let m = [member(0, 1, 4), member(1, 7, 2)];
        assert_eq!(by_available_replicas(10, &m, false, true).unwrap(), [5, 5]);
        // Unchanged total: unchanged assignment, even if the room changed.
        assert_eq!(by_available_replicas(6, &m, false, true).unwrap(), [4, 2]);
        // Fresh: current replicas count as room again: weights 5 and 9.
        assert_eq!(by_available_replicas(6, &m, true, true).unwrap(), [2, 4]);
    }

    #[test]
    fn steady_scale_down_shrinks_in_proportion() {
        let m = [member(0, 0, 6), member(1, 0, 3), member(2, 100, 0)];
        assert_eq!(
            by_available_replicas(6, &m, false, true).unwrap(),
            [4, 2, 0]
        );
        assert_eq!(aggregated(3, &m, false, true).unwrap(), [2, 1, 0]);
    }

    #[test]
    fn aggregated_uses_as_few_clusters_as_possible() {
        let m = [member(0, 3, 0), member(1, 8, 0), member(2, 5, 0)];
        // m2 alone can run 6.
        assert_eq!(aggregated(6, &m, false, true).unwrap(), [0, 6, 0]);
        // 10 needs m2 and m3, divided 8:5.
        assert_eq!(aggregated(10, &m, false, true).unwrap(), [0, 6, 4]);
        assert!(aggregated(17, &m, false, true).is_err());
        // Scale up from a cluster already used: it is filled first.
        let used = [member(0, 3, 2), member(1, 8, 0), member(2, 5, 0)];
        assert_eq!(aggregated(4, &used, false, true).unwrap(), [4, 0, 0]);
        // 5 more: m1 has room for 3, so m2 joins; divided 3:8.
        assert_eq!(aggregated(7, &used, false, true).unwrap(), [3, 4, 0]);
    }

    #[test]
    fn frozen_clusters_never_grow() {
        let m = [
            Member {
                frozen: true,
                ..member(0, 10, 2)
            },
            member(1, 3, 0),
        ];
        assert_eq!(by_available_replicas(5, &m, false, true).unwrap(), [2, 3]);
        assert!(by_available_replicas(6, &m, false, true).is_err());
        assert_eq!(by_available_replicas(1, &m, false, true).unwrap(), [1, 0]);
    }
}
