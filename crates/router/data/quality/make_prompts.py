#!/usr/bin/env python3
"""Writes the quality model's training prompts: graded requests of the kinds an edge model
meets, none taken from any benchmark. Routine choices (sentiment, topic, intent, yes/no),
short free-form questions (capitals, facts, small sums, greetings), multiple-choice
questions in MMLU's layout (general knowledge and arithmetic of graded difficulty) and word
problems (one step to several). Deterministic: python3 make_prompts.py DIR rewrites
DIR/classify, DIR/short, DIR/letter and DIR/number the same way every time.
"""
import json
import os
import random
import sys

rng = random.Random(20261202)

POSITIVE = ["great", "wonderful", "excellent", "fantastic", "lovely", "superb", "delightful", "amazing"]
NEGATIVE = ["terrible", "awful", "horrible", "disappointing", "broken", "useless", "dreadful", "poor"]
THINGS = ["phone", "hotel room", "pizza", "laptop", "movie", "concert", "haircut", "bus service",
          "coffee", "book", "headphones", "restaurant", "app update", "flight", "jacket"]
NEUTRAL = ["The {t} arrived on Tuesday.", "I picked up the {t} this morning.",
           "The {t} comes in three colours.", "We talked about the {t} at lunch.",
           "The {t} is on the second floor.", "My sister also has a {t}."]


def sentiment():
    out = []
    for _ in range(110):
        t = rng.choice(THINGS)
        kind = rng.randrange(3)
        if kind == 0:
            text = rng.choice([f"The {t} was {rng.choice(NEGATIVE)}.", f"What a {rng.choice(NEGATIVE)} {t}, never again.",
                               f"Honestly the {t} is {rng.choice(NEGATIVE)} and I want a refund."])
        elif kind == 1:
            text = rng.choice(NEUTRAL).format(t=t)
        else:
            text = rng.choice([f"The {t} was {rng.choice(POSITIVE)}!", f"Such a {rng.choice(POSITIVE)} {t}, I loved it.",
                               f"I am so happy with the {t}, it is {rng.choice(POSITIVE)}."])
        out.append({"prompt": f"Is the sentiment of this review negative, neutral or positive?\nReview: {text}\nSentiment:",
                    "choices": ["negative", "neutral", "positive"], "answer": kind})
    return out


TOPICS = {
    "sports": ["The striker scored twice in the final minutes of the match.", "She won the marathon in record time.",
               "The team traded its best pitcher before the playoffs.", "He missed the penalty and the cup was lost."],
    "politics": ["The senate passed the budget bill after a long debate.", "Voters go to the polls for the mayoral election.",
                 "The minister resigned after the scandal.", "Parliament rejected the proposed tax reform."],
    "technology": ["The new chip doubles battery life in laptops.", "The company released a software update for its phones.",
                   "Engineers built a faster database engine.", "The startup launched a cloud storage service."],
    "food": ["Simmer the tomato sauce for twenty minutes.", "The bakery sells fresh sourdough every morning.",
             "Add a pinch of salt to the soup.", "The chef grilled the salmon with lemon."],
}


def topics():
    names = list(TOPICS)
    out = []
    for _ in range(70):
        k = rng.randrange(len(names))
        text = rng.choice(TOPICS[names[k]])
        out.append({"prompt": f"Which topic is this text about: sports, politics, technology or food?\nText: {text}\nTopic:",
                    "choices": names, "answer": k})
    return out


INTENTS = {
    "weather": ["Will it rain tomorrow?", "How hot is it going to be today?", "Is it snowing in Oslo?"],
    "alarm": ["Wake me up at 6 am.", "Set an alarm for seven.", "Cancel my morning alarm."],
    "music": ["Play some jazz.", "Put on my workout playlist.", "Skip this song."],
    "booking": ["Book a table for two tonight.", "Reserve a hotel room in Rome.", "I need a flight to Madrid on Friday."],
}


def intents():
    names = list(INTENTS)
    out = []
    for _ in range(60):
        k = rng.randrange(len(names))
        text = rng.choice(INTENTS[names[k]])
        out.append({"prompt": f"Label the intent of this request as weather, alarm, music or booking.\nRequest: {text}\nIntent:",
                    "choices": names, "answer": k})
    return out


def yes_no():
    out = []
    for _ in range(60):
        a, b = rng.randrange(1, 100), rng.randrange(1, 100)
        if rng.random() < 0.5:
            q, truth = f"Is {a} greater than {b}?", a > b
        else:
            n = rng.randrange(2, 60)
            q, truth = f"Is {n} an even number?", n % 2 == 0
        out.append({"prompt": f"Answer yes or no. {q}\nAnswer:", "choices": ["no", "yes"], "answer": int(truth)})
    return out


CAPITALS = [("France", "Paris"), ("Japan", "Tokyo"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Germany", "Berlin"),
            ("Egypt", "Cairo"), ("Canada", "Ottawa"), ("Australia", "Canberra"), ("Brazil", "Brasília"),
            ("Kenya", "Nairobi"), ("Peru", "Lima"), ("Norway", "Oslo"), ("Russia", "Moscow"), ("China", "Beijing"),
            ("India", "New Delhi"), ("Mexico", "Mexico City"), ("Greece", "Athens"), ("Portugal", "Lisbon"),
            ("Turkey", "Ankara"), ("Poland", "Warsaw"), ("Argentina", "Buenos Aires"), ("Thailand", "Bangkok"),
            ("Vietnam", "Hanoi"), ("Morocco", "Rabat"), ("Nigeria", "Abuja"), ("Chile", "Santiago"),
            ("Sweden", "Stockholm"), ("Finland", "Helsinki"), ("Ireland", "Dublin"), ("Hungary", "Budapest"),
            ("Austria", "Vienna"), ("Colombia", "Bogotá"), ("Iran", "Tehran"), ("Pakistan", "Islamabad"),
            ("Ghana", "Accra"), ("Cuba", "Havana"), ("Nepal", "Kathmandu"), ("Mongolia", "Ulaanbaatar"),
            ("Kazakhstan", "Astana"), ("New Zealand", "Wellington")]

FACTS = [
    ("Which planet is known as the Red Planet?", "Mars", ["Venus", "Jupiter", "Saturn"]),
    ("What gas do plants absorb from the air for photosynthesis?", "Carbon dioxide", ["Oxygen", "Nitrogen", "Helium"]),
    ("How many legs does a spider have?", "Eight", ["Six", "Ten", "Four"]),
    ("What is the boiling point of water at sea level in Celsius?", "100 degrees", ["90 degrees", "80 degrees", "120 degrees"]),
    ("Which organ pumps blood through the body?", "The heart", ["The liver", "The lungs", "The kidney"]),
    ("What is the largest ocean on Earth?", "The Pacific Ocean", ["The Atlantic Ocean", "The Indian Ocean", "The Arctic Ocean"]),
    ("Who wrote the play Romeo and Juliet?", "William Shakespeare", ["Charles Dickens", "Jane Austen", "Mark Twain"]),
    ("What is the chemical symbol for gold?", "Au", ["Ag", "Fe", "Gd"]),
    ("Which animal is the largest mammal?", "The blue whale", ["The elephant", "The giraffe", "The hippopotamus"]),
    ("What is the freezing point of water in Fahrenheit?", "32 degrees", ["0 degrees", "100 degrees", "12 degrees"]),
    ("Which language has the most native speakers?", "Mandarin Chinese", ["English", "Spanish", "Hindi"]),
    ("In which continent is the Sahara desert?", "Africa", ["Asia", "South America", "Australia"]),
    ("What is the hardest natural substance?", "Diamond", ["Granite", "Iron", "Quartz"]),
    ("Which vitamin does sunlight help the body make?", "Vitamin D", ["Vitamin C", "Vitamin A", "Vitamin K"]),
    ("What is the main language spoken in Brazil?", "Portuguese", ["Spanish", "French", "Italian"]),
    ("Which part of the cell holds its genetic material?", "The nucleus", ["The membrane", "The ribosome", "The cytoplasm"]),
    ("Which particle carries a negative electric charge?", "The electron", ["The proton", "The neutron", "The photon"]),
    ("What force keeps the planets in orbit around the Sun?", "Gravity", ["Magnetism", "Friction", "Electricity"]),
    ("Which instrument measures atmospheric pressure?", "A barometer", ["A thermometer", "A hygrometer", "An ammeter"]),
    ("Which economist wrote The Wealth of Nations?", "Adam Smith", ["John Maynard Keynes", "Karl Marx", "David Ricardo"]),
    ("In which year did the Berlin Wall fall?", "1989", ["1979", "1991", "1985"]),
    ("Which blood cells fight infection?", "White blood cells", ["Red blood cells", "Platelets", "Plasma cells"]),
    ("What is the square root of 144?", "12", ["14", "10", "16"]),
    ("Which treaty ended the First World War with Germany?", "The Treaty of Versailles", ["The Treaty of Paris", "The Treaty of Utrecht", "The Treaty of Ghent"]),
    ("What does a lexicographer compile?", "Dictionaries", ["Maps", "Statistics", "Calendars"]),
    ("Which logical fallacy attacks the person instead of the argument?", "Ad hominem", ["Straw man", "Red herring", "Slippery slope"]),
    ("Which enzyme in saliva begins the digestion of starch?", "Amylase", ["Pepsin", "Lipase", "Trypsin"]),
    ("Which court case established judicial review in the United States?", "Marbury v. Madison", ["Roe v. Wade", "Brown v. Board of Education", "Plessy v. Ferguson"]),
    ("What is the derivative of x squared?", "2x", ["x", "x squared", "2"]),
    ("In accounting, what does a balance sheet report?", "Assets, liabilities and equity", ["Revenue and expenses", "Cash received only", "Tax owed only"]),
]


def mcq(question, right, wrong):
    options = [right] + wrong[:3]
    rng.shuffle(options)
    key = "ABCD"[options.index(right)]
    body = "\n".join(f"{l}. {o}" for l, o in zip("ABCD", options))
    return {"prompt": f"{question}\n{body}\nAnswer:", "answer": key}


def letters():
    out = []
    for country, capital in CAPITALS:
        others = [c for _, c in CAPITALS if c != capital]
        out.append(mcq(f"What is the capital of {country}?", capital, rng.sample(others, 3)))
    for q, right, wrong in FACTS:
        out.append(mcq(q, right, wrong))
        out.append(mcq(q, right, list(reversed(wrong))))
    for _ in range(60):
        a, b = rng.randrange(1, 10), rng.randrange(1, 10)
        right = a + b
        out.append(mcq(f"What is {a} + {b}?", str(right), [str(right + d) for d in rng.sample([-2, -1, 1, 2, 3], 3)]))
    for _ in range(60):
        a, b = rng.randrange(12, 99), rng.randrange(12, 99)
        right = a * b
        out.append(mcq(f"What is {a} × {b}?", str(right), [str(right + d) for d in rng.sample([-20, -10, 10, 20, 30, -30], 3)]))
    for _ in range(40):
        x = rng.randrange(2, 20)
        a, c = rng.randrange(2, 9), rng.randrange(1, 30)
        out.append(mcq(f"Solve for x: {a}x + {c} = {a * x + c}.", str(x), [str(x + d) for d in rng.sample([-3, -1, 1, 2, 4], 3)]))
    return out


def short():
    out = []
    for country, capital in CAPITALS:
        form = rng.choice(["What is the capital of {c}?", "Which city is the capital of {c}?",
                           "Name the capital city of {c}."])
        out.append({"prompt": form.format(c=country), "answers": [capital.split()[0]]})
    for q, right, _ in FACTS:
        out.append({"prompt": q, "answers": [right.replace("The ", "").split(" (")[0]]})
    for _ in range(30):
        a, b = rng.randrange(1, 10), rng.randrange(1, 10)
        out.append({"prompt": f"What is {a} plus {b}?", "answers": [str(a + b)]})
    for _ in range(30):
        a, b, c = rng.randrange(13, 99), rng.randrange(13, 99), rng.randrange(3, 9)
        out.append({"prompt": f"What is {a} times {b} minus {c}?", "answers": [str(a * b - c)]})
    for word, opposite in [("hot", "cold"), ("up", "down"), ("big", "small"), ("fast", "slow"),
                           ("happy", "sad"), ("light", "dark"), ("early", "late"), ("open", "close")]:
        out.append({"prompt": f"What is the opposite of '{word}'? Answer in one word.", "answers": [opposite]})
    return out


NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Gus", "Hana"]
ITEMS = ["apples", "pencils", "stickers", "marbles", "books", "cookies"]


def numbers():
    out = []
    for i in range(70):
        n, item = rng.choice(NAMES), rng.choice(ITEMS)
        a, b, c, p = rng.randrange(3, 30), rng.randrange(2, 12), rng.randrange(2, 6), rng.randrange(2, 9)
        steps = i % 4
        if steps == 0:
            q, ans = f"{n} has {a} {item} and buys {b} more. How many {item} does {n} have now?", a + b
        elif steps == 1:
            q, ans = f"{n} has {a + b} {item} and gives away {b}. How many {item} are left?", a
        elif steps == 2:
            q, ans = (f"{n} buys {c} boxes of {item} with {b} in each box and already had {a}. "
                      f"How many {item} does {n} have?", a + b * c)
        else:
            q, ans = (f"{n} buys {c} boxes of {item} with {b} in each box, gives {a % (b * c) or 1} to a friend, "
                      f"then sells the rest for ${p} each. How many dollars does {n} make?", (b * c - (a % (b * c) or 1)) * p)
        out.append({"prompt": q, "answer": ans})
    return out


def write(path, rows):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    write(os.path.join(out, "classify", "sentiment.jsonl"), sentiment())
    write(os.path.join(out, "classify", "topic.jsonl"), topics())
    write(os.path.join(out, "classify", "intent.jsonl"), intents())
    write(os.path.join(out, "classify", "yes_no.jsonl"), yes_no())
    write(os.path.join(out, "short", "facts_and_sums.jsonl"), short())
    write(os.path.join(out, "letter", "knowledge_and_arithmetic.jsonl"), letters())
    write(os.path.join(out, "number", "word_problems.jsonl"), numbers())


if __name__ == "__main__":
    main()
