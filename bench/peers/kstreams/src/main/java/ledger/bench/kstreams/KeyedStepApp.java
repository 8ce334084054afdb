package ledger.bench.kstreams;

import java.io.File;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.AppInfoParser;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.state.Stores;

/**
 * The Kafka Streams peer of the processor benchmark: the keyed step ({@link KeyedStep}) under
 * exactly-once v2 with a persistent RocksDB store.
 *
 * <p>Exactly-once v2 ({@code processing.guarantee=exactly_once_v2}, KIP-447): one
 * transactional producer per stream thread commits the input offsets, the output records and
 * the store's changelog records in one Kafka transaction every {@code commit.interval.ms}.
 * The store is {@code Stores.persistentKeyValueStore} (RocksDB under {@code state.dir}),
 * logged to its changelog topic {@code <application.id>-keyed-step-state-changelog}; caching
 * is off (the builder's default), so every update reaches the changelog. Everything not set
 * here is Kafka Streams' default (one stream thread).
 *
 * <p>Usage (the driver, {@code bench/peers/kstreams_bench.py}, runs it):
 *
 * <pre>
 * java -jar target/kstreams-peer.jar --bootstrap HOST:PORT --input TOPIC --output TOPIC
 *     --application-id ID --state-dir DIR --commit-interval-ms MS --schemas DIR
 * </pre>
 *
 * <p>Protocol with the driver: after building the topology and the client it writes one
 * line {@code READY <kafka-streams version>} to stdout, then starts; SIGTERM closes it
 * cleanly (the last transaction is committed) and leaves the group, as a Python client's
 * {@code close()} does, so the driver can delete the group at once. It exits with status 1 if a stream thread
 * dies, and 2 on bad arguments.
 */
public final class KeyedStepApp {

  /** The key-value store of operation states (its changelog topic is named after it). */
  public static final String STORE = "keyed-step-state";

  /** Longest a SIGTERM waits for the clean close. */
  private static final Duration CLOSE_TIMEOUT = Duration.ofSeconds(30);

  private KeyedStepApp() {}

  /**
   * The topology: input (String key, bytes value) through {@link KeyedStep} to output
   * (String key, JSON String value), with the store {@link #STORE}.
   *
   * @param input the intents topic
   * @param output the output topic (one record per input)
   * @param decoder the intent decoder
   * @return the topology to run
   */
  public static Topology topology(String input, String output, KeyedStep.IntentDecoder decoder) {
    StreamsBuilder builder = new StreamsBuilder();
    builder.addStateStore(
        Stores.keyValueStoreBuilder(
            Stores.persistentKeyValueStore(STORE), Serdes.String(), Serdes.ByteArray()));
    builder.stream(input, Consumed.with(Serdes.String(), Serdes.ByteArray()))
        .process(() -> new KeyedStep(STORE, decoder), STORE)
        .to(output, Produced.with(Serdes.String(), Serdes.String()));
    return builder.build();
  }

  /**
   * The Streams configuration: exactly-once v2, the given commit interval and state folder.
   *
   * @param args the parsed arguments (see the class comment)
   * @return the properties for {@link KafkaStreams}
   */
  public static Properties config(Map<String, String> args) {
    Properties props = new Properties();
    props.put(StreamsConfig.APPLICATION_ID_CONFIG, args.get("application-id"));
    props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args.get("bootstrap"));
    props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
    props.put(
        StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, Long.parseLong(args.get("commit-interval-ms")));
    props.put(StreamsConfig.STATE_DIR_CONFIG, args.get("state-dir"));
    // A dynamic member of a Streams app does not leave its group on close (Streams turns
    // the consumer's leave off); this benchmark deletes the group right after, so leave.
    props.put(StreamsConfig.mainConsumerPrefix("internal.leave.group.on.close"), true);
    return props;
  }

  /**
   * Run the app until SIGTERM (see the class comment for the protocol).
   *
   * @param argv {@code --name value} pairs, all of them required
   * @throws Exception the schemas cannot be read, or the client cannot be built
   */
  public static void main(String[] argv) throws Exception {
    Map<String, String> args = parse(argv);
    KeyedStep.IntentDecoder decoder = new KeyedStep.IntentDecoder(new File(args.get("schemas")));
    KafkaStreams streams =
        new KafkaStreams(topology(args.get("input"), args.get("output"), decoder), config(args));
    CountDownLatch stopped = new CountDownLatch(1);
    AtomicBoolean failed = new AtomicBoolean(false);
    AtomicBoolean closing = new AtomicBoolean(false);
    streams.setUncaughtExceptionHandler(
        exc -> {
          System.err.println("stream thread failed: " + exc);
          failed.set(true);
          return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
    streams.setStateListener(
        (now, before) -> {
          if (now == KafkaStreams.State.ERROR || now == KafkaStreams.State.NOT_RUNNING) {
            stopped.countDown();
          }
        });
    Runtime.getRuntime()
        .addShutdownHook(
            new Thread(
                () -> {
                  closing.set(true);
                  streams.close(
                      new KafkaStreams.CloseOptions().timeout(CLOSE_TIMEOUT).leaveGroup(true));
                },
                "close-on-sigterm"));
    System.out.println("READY " + AppInfoParser.getVersion());
    System.out.flush();
    streams.start();
    stopped.await();
    if (failed.get() && !closing.get()) {
      System.exit(1);
    }
  }

  private static Map<String, String> parse(String[] argv) {
    String[] required = {
      "bootstrap", "input", "output", "application-id", "state-dir", "commit-interval-ms", "schemas"
    };
    Map<String, String> args = new HashMap<>();
    for (int i = 0; i + 1 < argv.length; i += 2) {
      if (!argv[i].startsWith("--")) {
        usage("expected --name value pairs, got " + argv[i]);
      }
      args.put(argv[i].substring(2), argv[i + 1]);
    }
    for (String name : required) {
      if (!args.containsKey(name)) {
        usage("missing --" + name);
      }
    }
    return args;
  }

  private static void usage(String problem) {
    System.err.println(
        "KeyedStepApp: "
            + problem
            + "\nusage: java -jar kstreams-peer.jar --bootstrap HOST:PORT --input TOPIC"
            + " --output TOPIC --application-id ID --state-dir DIR --commit-interval-ms MS"
            + " --schemas DIR");
    System.exit(2);
  }
}
