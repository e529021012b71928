"""Double-DQN plan search over `strategies.PlanEnv` (Auto-MAP's learned search), in Keras.

An episode walks the environment's decisions (mesh, micro-batches, one per linkage unit, one
per pipeline cut); forced decisions are taken without asking the network and a prefix whose
memory lower bound overflows a device ends at once (`pruning.Pruner`). Observations come from
`env_features.Features`; illegal actions are masked when acting and in the bootstrap target.

Reward (terminal only, gamma 1, times `reward_scale`): log speed-up over the pure
data-parallel plan (its step time is the search's first cost-model call), clipped at -2.5; a
plan or prefix that overflows memory gets -3 minus its overflow (at most -5), below every plan
that fits.

Learning: an online and a target Q-network (Double DQN target: the online network picks the
next action, the target network values it), uniform replay, Huber loss, Adam, epsilon decaying
with the share of the budget spent. Because the environment is deterministic, the best return
ever seen after a (prefix, action) pair is a lower bound on its optimal value, and the target
is raised to it (as in lower-bound Q-learning / self-imitation): one good plan deep in a
subtree lifts the value of the decisions leading to it at once, instead of after many
bootstrapping sweeps. A count-based bonus (UCB on exact prefixes) steers exploration to
actions rarely tried from a prefix. Episodes run in lock-step batches so each decision costs
one forward pass per batch. The budget counts distinct plans priced by the cost model (the
environment caches by plan); revisiting a priced plan is free, so the search also stops after
`max_episodes_per_call` episodes per call of budget; a batch of episodes that priced nothing
new doubles epsilon for the next batch (reset once something new is priced).

Same seed, same plan and same number of cost-model calls: weights are initialised from the
seed, exploration and replay sampling use a seeded NumPy generator.
"""

import dataclasses
import math
import time

import numpy as np

from tf_fusionstitch.planner import cost_model as cm
from tf_fusionstitch.planner import env_features, pruning
from tf_fusionstitch.planner.search_common import make_plan, reference_config

DEFAULT_BUDGET = 300
FEASIBLE_FLOOR = -2.5      # reward clip for plans that fit (at most ~12x slower than DP)
INFEASIBLE_REWARD = -3.0   # minus up to 2 more for how far memory overflows


@dataclasses.dataclass
class Settings:
    hidden: tuple = (128, 128)
    learning_rate: float = 1e-3
    gamma: float = 1.0
    batch_size: int = 64
    replay_size: int = 20000
    parallel_episodes: int = 8
    train_steps_per_batch: int = 8
    target_sync: int = 50          # train steps between target-network copies
    epsilon_start: float = 1.0
    epsilon_end: float = 0.05
    epsilon_decay: float = 0.6     # share of the budget over which epsilon decays
    reward_scale: float = 10.0     # log speed-ups of near-optimal plans differ by ~0.01
    bonus: float = 0.2             # count-based exploration bonus, in reward units
    max_episodes_per_call: int = 6


@dataclasses.dataclass
class Result:
    best: cm.Config               # best plan priced during the search
    policy: cm.Config             # the final greedy policy's plan (None if not priced)
    reference: cm.Config          # the data-parallel plan rewards are measured against
    calls: int
    episodes: int
    train_steps: int
    early_ends: int               # episodes cut short by the memory lower bound
    wall_time: float


class _Replay:
    """Uniform replay. Each transition also names its (prefix, action) pair, whose best
    return seen so far is kept in `best_return` (the module docstring says why)."""

    def __init__(self, size, obs_size, actions):
        self.obs = np.zeros((size, obs_size), np.float32)
        self.next_obs = np.zeros((size, obs_size), np.float32)
        self.next_mask = np.zeros((size, actions), bool)
        self.action = np.zeros(size, np.int32)
        self.reward = np.zeros(size, np.float32)
        self.done = np.zeros(size, np.float32)
        self.key = np.zeros(size, np.int64)
        self.size, self.n, self.i = size, 0, 0
        self.keys = {}                       # (prefix, action) -> key id
        self.best_return = np.full(1024, -np.inf, np.float32)

    def key_of(self, state, action):
        k = self.keys.setdefault((state, action), len(self.keys))
        if k >= len(self.best_return):
            grown = np.full(2 * len(self.best_return), -np.inf, np.float32)
            grown[:len(self.best_return)] = self.best_return
            self.best_return = grown
        return k

    def add(self, key, obs, action, reward, next_obs, next_mask, done):
        i = self.i
        self.key[i], self.obs[i], self.action[i], self.reward[i] = key, obs, action, reward
        self.next_obs[i], self.next_mask[i], self.done[i] = next_obs, next_mask, done
        self.i = (i + 1) % self.size
        self.n = min(self.n + 1, self.size)

    def episode_return(self, keys, value):
        for k in keys:
            self.best_return[k] = max(self.best_return[k], value)

    def sample(self, rng, steps, k):
        """`steps` minibatches of `k` transitions, stacked on a leading axis."""
        idx = rng.integers(0, self.n, size=(steps, k))
        return (self.obs[idx], self.action[idx], self.reward[idx], self.next_obs[idx],
                self.next_mask[idx], self.done[idx], self.best_return[self.key[idx]])


_NETWORKS = {}   # (shapes, settings) -> _QNetworks, reused across searches


class _QNetworks:
    """Online and target Keras networks with a compiled Double-DQN train step.

    Acting uses a NumPy copy of the online weights, refreshed after each training block: for
    a network this small a TensorFlow call costs ~1000x the arithmetic.
    """

    def __init__(self, obs_size, actions, settings):
        import keras
        import tensorflow as tf

        def build():
            layers = [keras.Input((obs_size,))]
            layers += [keras.layers.Dense(width, activation="relu") for width in settings.hidden]
            layers.append(keras.layers.Dense(actions))
            return keras.Sequential(layers)

        self.online, self.target = build(), build()
        self.optimizer = keras.optimizers.Adam(settings.learning_rate)
        gamma = settings.gamma
        online, target, optimizer = self.online, self.target, self.optimizer
        huber = keras.losses.Huber()
        f32 = tf.float32
        spec = [tf.TensorSpec([None, None, obs_size], f32), tf.TensorSpec([None, None], tf.int32),
                tf.TensorSpec([None, None], f32), tf.TensorSpec([None, None, obs_size], f32),
                tf.TensorSpec([None, None, actions], tf.bool), tf.TensorSpec([None, None], f32),
                tf.TensorSpec([None, None], f32)]

        @tf.function(input_signature=spec)
        def train(obs, action, reward, next_obs, next_mask, done, best_return):
            """One gradient step per leading index (a block of sampled minibatches)."""
            for k in tf.range(tf.shape(obs)[0]):
                masked = tf.where(next_mask[k], online(next_obs[k], training=False), -1e9)
                next_action = tf.argmax(masked, axis=1, output_type=tf.int32)
                next_q = tf.gather(target(next_obs[k], training=False), next_action,
                                   batch_dims=1)
                y = reward[k] + gamma * (1.0 - done[k]) * next_q
                # Deterministic environment: a return seen after (s, a) bounds Q*(s, a).
                y = tf.maximum(y, best_return[k])
                with tf.GradientTape() as tape:
                    q = tf.gather(online(obs[k], training=True), action[k], batch_dims=1)
                    loss = huber(tf.stop_gradient(y), q)
                grads = tape.gradient(loss, online.trainable_variables)
                optimizer.apply_gradients(zip(grads, online.trainable_variables))

        self._train = train

    @classmethod
    def get(cls, obs_size, actions, settings, seed):
        """Networks for a search, initialised from `seed`. Built and traced once per shape
        and process (tracing costs seconds; a search on a small space, less)."""
        key = (obs_size, actions, settings.hidden, settings.learning_rate, settings.gamma)
        if key not in _NETWORKS:
            _NETWORKS[key] = cls(obs_size, actions, settings)
        nets = _NETWORKS[key]
        nets.reset(seed)
        return nets

    def reset(self, seed):
        """Glorot-uniform kernels and zero biases from `seed`; fresh Adam state."""
        import keras
        for i, layer in enumerate(self.online.layers):
            init = keras.initializers.GlorotUniform(seed=seed * 97 + i)
            layer.kernel.assign(init(layer.kernel.shape))
            layer.bias.assign(np.zeros(layer.bias.shape, np.float32))
        for v in self.optimizer.variables:
            if not v.path.endswith("learning_rate"):
                v.assign(np.zeros(v.shape, v.dtype))
        self.sync()
        self._refresh()

    def _refresh(self):
        self._weights = self.online.get_weights()

    def q_values(self, obs):
        h = obs
        w = self._weights
        for i in range(0, len(w) - 2, 2):
            h = np.maximum(h @ w[i] + w[i + 1], 0.0)
        return h @ w[-2] + w[-1]

    def train(self, batches):
        self._train(*batches)
        self._refresh()

    def sync(self):
        self.target.set_weights(self.online.get_weights())


class DQNSearch:
    """One search: `run()` returns a `Result`. See the module docstring."""

    def __init__(self, env, budget=None, seed=0, settings=None):
        self.env = env
        self.budget = budget or DEFAULT_BUDGET
        self.seed = seed
        self.s = settings or Settings()
        self.pruner = pruning.Pruner(env)
        self.features = env_features.Features(env, self.pruner)
        self.rng = np.random.default_rng(seed)
        self.actions = env.action_space_size
        self.start_calls = env.calls
        self.best, self.best_obj = None, math.inf
        self.counts = {}    # prefix -> times each action was taken there
        self._masks, self._next, self._deads = {}, {}, {}   # episodes revisit prefixes

    # -- pricing -------------------------------------------------------------------------------

    @property
    def used(self):
        return self.env.calls - self.start_calls

    def _price(self, config):
        """Objective of `config`, or None when pricing it would exceed the budget."""
        if not self.env.is_priced(config) and self.used >= self.budget:
            return None
        est = self.env.evaluate(config)
        obj = self.env.objective(est)
        if obj < self.best_obj:
            self.best, self.best_obj = config, obj
        return est

    def _reward(self, est):
        if est.feasible:
            r = max(FEASIBLE_FLOOR, math.log(self.ref_time / est.step_time))
            return self.s.reward_scale * r
        return self._overflow_reward(est.peak_memory)

    def _overflow_reward(self, nbytes):
        r = INFEASIBLE_REWARD - min(2.0, nbytes / self.env.cluster.memory - 1.0)
        return self.s.reward_scale * r

    # -- acting --------------------------------------------------------------------------------

    def _mask(self, state):
        if state not in self._masks:
            self._masks[state] = np.asarray(self.env.legal_mask(state), bool)
        return self._masks[state]

    def _choose(self, q, mask, epsilon, state=None):
        """Epsilon-greedy over legal actions; with `state`, Q plus a UCB-style bonus for
        actions rarely taken from that exact prefix (prefixes are discrete, so counts are
        exact), which steers exploration to unpriced plans."""
        legal = np.flatnonzero(mask)
        if self.rng.random() < epsilon:
            choice = int(legal[self.rng.integers(len(legal))])
        elif state is None or self.s.bonus <= 0:
            return int(legal[np.argmax(q[legal])])
        else:
            counts = self.counts.setdefault(state, np.zeros(self.actions))
            bonus = self.s.bonus * np.sqrt(np.log1p(counts.sum()) / (1.0 + counts[legal]))
            choice = int(legal[np.argmax(q[legal] + bonus)])
        if state is not None:
            self.counts.setdefault(state, np.zeros(self.actions))[choice] += 1
        return choice

    def _advance(self, state, action):
        """The next state the network is asked about (forced decisions taken)."""
        key = (state, action)
        if key not in self._next:
            self._next[key] = self.pruner.advance(self.env.step(state, action))
        return self._next[key]

    def _dead(self, state):
        """Whether the memory bound ends an episode at `state` (never a complete one)."""
        if state not in self._deads:
            self._deads[state] = self.prune_memory and not self.env.complete(state) and \
                self.pruner.dead(state)
        return self._deads[state]

    def _finish(self, state):
        """(reward, done) after arriving at `state` (forced decisions already taken); reward
        None means the budget ran out before the plan could be priced."""
        if self.env.complete(state):
            est = self._price(self.env.config(state))
            return (None if est is None else self._reward(est)), True
        if self._dead(state):
            self.early_ends += 1
            return self._overflow_reward(self.pruner.memory_lower_bound(state)), True
        return 0.0, False

    def _episodes(self, count, epsilon, replay):
        """Plays `count` episodes in lock-step; stores their transitions in `replay`."""
        states = [self.start] * count
        keys = [[] for _ in range(count)]
        live = list(range(count))
        while live:
            obs = np.stack([self.features.observe(states[i]) for i in live])
            q = self.nets.q_values(obs)
            still = []
            for row, i in enumerate(live):
                mask = self._mask(states[i])
                action = self._choose(q[row], mask, epsilon, states[i])
                nxt = self._advance(states[i], action)
                reward, done = self._finish(nxt)
                if reward is None:          # budget exhausted: drop the unpriced episode
                    continue
                key = replay.key_of(states[i], action)
                keys[i].append(key)
                replay.add(key, obs[row], action, reward, self.features.observe(nxt),
                           self._mask(nxt) if not done else np.zeros(self.actions, bool),
                           float(done))
                states[i] = nxt
                if done:
                    replay.episode_return(keys[i], reward)   # gamma 1, terminal reward only
                else:
                    still.append(i)
            live = still

    def _greedy_state(self):
        state = self.start
        while not self.env.complete(state) and not self._dead(state):
            q = self.nets.q_values(self.features.observe(state)[None])[0]
            state = self._advance(state, self._choose(q, self._mask(state), 0.0))
        return state

    # -- the search ----------------------------------------------------------------------------

    def run(self):
        t0 = time.perf_counter()
        s, env = self.s, self.env
        self.early_ends = 0
        self.reference = reference_config(env)
        self.ref_time = self._price(self.reference).step_time
        self.start = self.pruner.advance(env.reset())
        # If even the start overflows, every plan does: keep pricing so the least bad wins.
        self.prune_memory = not self.pruner.dead(self.start)
        episodes = train_steps = 0
        policy = None
        if not env.complete(self.start):
            self.nets = _QNetworks.get(self.features.size, self.actions, s, self.seed)
            replay = _Replay(s.replay_size, self.features.size, self.actions)
            max_episodes = s.max_episodes_per_call * self.budget
            boost = 0.0
            while self.used < self.budget and episodes < max_episodes:
                progress = max(self.used / self.budget, episodes / max_episodes)
                epsilon = s.epsilon_end + (s.epsilon_start - s.epsilon_end) * \
                    max(0.0, 1.0 - progress / s.epsilon_decay)
                epsilon = min(1.0, max(epsilon, boost))
                before = self.used
                self._episodes(s.parallel_episodes, epsilon, replay)
                episodes += s.parallel_episodes
                # A batch that priced nothing new only replayed known plans: explore more.
                boost = 0.0 if self.used > before else max(2 * boost, s.epsilon_end)
                if replay.n >= s.batch_size:
                    k = s.train_steps_per_batch
                    self.nets.train(replay.sample(self.rng, k, s.batch_size))
                    if (train_steps + k) // s.target_sync > train_steps // s.target_sync:
                        self.nets.sync()
                    train_steps += k
            final = self._greedy_state()
            if env.complete(final) and self._price(env.config(final)) is not None:
                policy = env.config(final)
        else:
            self._price(env.config(self.start))
            policy = env.config(self.start)
        return Result(self.best, policy, self.reference, self.used, episodes, train_steps,
                      self.early_ends, time.perf_counter() - t0)


def dqn(env, budget=None, seed=0):
    """The searches' interface: (Plan of the best plan priced, cost-model calls used)."""
    result = DQNSearch(env, budget, seed).run()
    return make_plan(env, result.best, "dqn"), result.calls
